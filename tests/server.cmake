# keel serve: the test_server* executables also link the server's client
# and converters (keel_server_api) and the harness tests/server_util.c, and
# run the keel binary (so they depend on it).
foreach(t test_server test_server_api test_server_load test_server_replay test_server_toolgrammar)
  if(TARGET ${t})
    target_sources(${t} PRIVATE ${PROJECT_SOURCE_DIR}/tests/server_util.c)
    target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
    target_link_libraries(${t} PRIVATE keel_server_api)
    add_dependencies(${t} keel)
  endif()
endforeach()

# The real SDK clients (npm packages openai and @anthropic-ai/sdk, pinned in
# tests/server-clients/package-lock.json, installed by `npm ci` into the
# build dir). Exit 77 (no node/npm, or npm cannot reach the registry) is a skip.
add_test(NAME server_clients COMMAND sh ${PROJECT_SOURCE_DIR}/tests/server-clients/run.sh)
set_tests_properties(server_clients PROPERTIES
  ENVIRONMENT "KEEL_BIN=${CMAKE_BINARY_DIR}/keel;KEEL_BUILD=${CMAKE_BINARY_DIR}"
  SKIP_RETURN_CODE 77 TIMEOUT 1500)

# The SDK tests share one npm install (a fixture: never two at once).
add_test(NAME server_clients_install COMMAND sh ${PROJECT_SOURCE_DIR}/tests/server-clients/install.sh)
set_tests_properties(server_clients_install PROPERTIES
  ENVIRONMENT "KEEL_BUILD=${CMAKE_BINARY_DIR}" SKIP_RETURN_CODE 77 TIMEOUT 900
  FIXTURES_SETUP npm_clients)
set_tests_properties(server_clients PROPERTIES FIXTURES_REQUIRED npm_clients)
# A coding agent's turns through both SDKs on a sliding-window and a hybrid
# model: every turn reuses the system prompt and tools; answers equal a
# fresh server's (tests/server-clients/agent.sh).
add_test(NAME server_agent COMMAND sh ${PROJECT_SOURCE_DIR}/tests/server-clients/agent.sh)
set_tests_properties(server_agent PROPERTIES
  ENVIRONMENT "KEEL_BIN=${CMAKE_BINARY_DIR}/keel;KEEL_BUILD=${CMAKE_BINARY_DIR}"
  SKIP_RETURN_CODE 77 TIMEOUT 1500 FIXTURES_REQUIRED npm_clients)
# The chat page at / in headless Chromium (tests/server-clients/page.sh):
# two streamed turns, the memory panel, Stop, the API key, model output
# holding markup shown as text; screenshots in build/page-test/.
add_test(NAME server_page COMMAND sh ${PROJECT_SOURCE_DIR}/tests/server-clients/page.sh)
set_tests_properties(server_page PROPERTIES
  ENVIRONMENT "KEEL_BIN=${CMAKE_BINARY_DIR}/keel;KEEL_BUILD=${CMAKE_BINARY_DIR}"
  SKIP_RETURN_CODE 77 TIMEOUT 600 FIXTURES_REQUIRED npm_clients)
