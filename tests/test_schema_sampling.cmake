# schema_sampling: generation under 200+ JSON Schemas (the suite's that the
# compiler accepts, and tests/schema_sampling/tools.json) with a generated
# random-weight model; every complete output validated by Debian's
# python3-jsonschema (tests/schema_sampling/sample.py; docs/grammar-conformance.md).
# Skips (exit 77) without python3-jsonschema. Debian's python3 first: the
# validator the check names is Debian's package.
# --min-schemas: the schemas the compiler accepts and samples (91 on main at
# 1a9d098; 382 with issue 24's compiler), rounded down; raised as it grows.
if(NOT KEEL_FUZZ)
  find_program(KEEL_SAMPLING_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
  if(NOT KEEL_SAMPLING_PYTHON3)
    find_program(KEEL_SAMPLING_PYTHON3 python3)
  endif()
  set(keel_sampling_env "")
  if(KEEL_SANITIZE)
    # python3 loads the instrumented libkeel.so: preload the runtimes
    execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libasan.so
                    OUTPUT_VARIABLE keel_s_asan OUTPUT_STRIP_TRAILING_WHITESPACE)
    execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libubsan.so
                    OUTPUT_VARIABLE keel_s_ubsan OUTPUT_STRIP_TRAILING_WHITESPACE)
    set(keel_sampling_env "LD_PRELOAD=${keel_s_asan} ${keel_s_ubsan};ASAN_OPTIONS=detect_leaks=0")
  endif()
  if(KEEL_SAMPLING_PYTHON3)
    add_test(NAME schema_sampling
      COMMAND ${KEEL_SAMPLING_PYTHON3} ${PROJECT_SOURCE_DIR}/tests/schema_sampling/sample.py
        --keel $<TARGET_FILE:keel> --lib $<TARGET_FILE:libkeel_shared>
        --seeds 3 --max-tokens 384 --min-schemas 380 --out ${CMAKE_BINARY_DIR}/schema_sampling)
  else()
    add_test(NAME schema_sampling COMMAND sh -c "echo 'schema_sampling: skipped: no python3'; exit 77")
  endif()
  set_tests_properties(schema_sampling PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
    ENVIRONMENT "${keel_sampling_env}")
endif()
