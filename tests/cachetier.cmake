# The shared prompt-cache tier (docs/cache-tier.md): two keel serve
# processes, a real redis-server and haproxy round-robin in front of them,
# a 20-turn agent conversation on a dense, a sliding-window and a hybrid
# model, with faults (tests/cachetier/scale_test.py). Exit 77 (no
# redis-server or haproxy) is a skip; scripts/install-deps.sh installs both.
if(NOT KEEL_FUZZ)
  find_program(KEEL_PYTHON3 NAMES python3)
  if(KEEL_PYTHON3)
    add_test(NAME cachetier_scale COMMAND ${KEEL_PYTHON3} ${PROJECT_SOURCE_DIR}/tests/cachetier/scale_test.py $<TARGET_FILE:keel>)
    set_tests_properties(cachetier_scale PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900)
  endif()
endif()
