# keel chat (app/cli/cmd_chat.c): on a terminal through tmux
# (tests/chat_tmux.py: Ctrl-C mid-answer, multi-line input, /save then /load
# in a new process reusing the cache; skipped, exit 77, without tmux) and
# through a pipe (tests/chat_pipe.sh: one answer per message, reasoning and
# tool calls shown, user errors lose nothing). Each on a generated model
# and on the stories260K fixture when it exists.
if(NOT KEEL_FUZZ)
  find_program(KEEL_PYTHON3 NAMES python3)
  if(KEEL_PYTHON3)
    add_test(NAME chat_tmux COMMAND ${KEEL_PYTHON3} ${PROJECT_SOURCE_DIR}/tests/chat_tmux.py $<TARGET_FILE:keel>)
    add_test(NAME chat_tmux_stories COMMAND ${KEEL_PYTHON3} ${PROJECT_SOURCE_DIR}/tests/chat_tmux.py
      $<TARGET_FILE:keel> ${KEEL_FIXTURES}/models/stories260K.gguf)
    set_tests_properties(chat_tmux chat_tmux_stories PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
  endif()
  add_test(NAME chat_pipe COMMAND sh ${PROJECT_SOURCE_DIR}/tests/chat_pipe.sh $<TARGET_FILE:keel>)
  add_test(NAME chat_pipe_stories COMMAND sh ${PROJECT_SOURCE_DIR}/tests/chat_pipe.sh $<TARGET_FILE:keel>
    ${KEEL_FIXTURES}/models/stories260K.gguf)
  set_tests_properties(chat_pipe chat_pipe_stories PROPERTIES TIMEOUT 600)
endif()
