# The Python package (python/, ctypes over libkeel.so): its pytest suite
# (python/tests/run.sh; skips, exit 77, without a python3 that has pytest),
# and examples/python/chat.py, a user of the package
# (tests/pkg/python_chat_test.sh): on a generated model, and on the
# stories260K fixture when it exists (skip without python3). Under ASan
# python3 preloads the sanitizer runtimes the instrumented libkeel.so needs.
if(NOT KEEL_FUZZ)
  set(KEEL_PY_ENV "")
  if(KEEL_SANITIZE)
    execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libasan.so
                    OUTPUT_VARIABLE keel_asan_rt OUTPUT_STRIP_TRAILING_WHITESPACE)
    execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libubsan.so
                    OUTPUT_VARIABLE keel_ubsan_rt OUTPUT_STRIP_TRAILING_WHITESPACE)
    set(KEEL_PY_ENV "KEEL_PRELOAD=${keel_asan_rt} ${keel_ubsan_rt}")
  endif()
  set(keel_py_test ${PROJECT_SOURCE_DIR}/tests/pkg/python_chat_test.sh)
  add_test(NAME python_chat
    COMMAND sh ${keel_py_test} ${PROJECT_SOURCE_DIR} $<TARGET_FILE:keel> $<TARGET_LINKER_FILE:libkeel_shared>)
  add_test(NAME python_chat_stories
    COMMAND sh ${keel_py_test} ${PROJECT_SOURCE_DIR} $<TARGET_FILE:keel> $<TARGET_LINKER_FILE:libkeel_shared>
      ${KEEL_FIXTURES}/models/stories260K.gguf)
  add_test(NAME python_pkg
    COMMAND sh ${PROJECT_SOURCE_DIR}/python/tests/run.sh ${PROJECT_SOURCE_DIR} $<TARGET_FILE:keel>
      $<TARGET_LINKER_FILE:libkeel_shared>)
  set_tests_properties(python_chat python_chat_stories python_pkg PROPERTIES
    SKIP_RETURN_CODE 77 TIMEOUT 600 ENVIRONMENT "${KEEL_PY_ENV}")
endif()
