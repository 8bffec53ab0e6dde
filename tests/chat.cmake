# The chat conformance suite reads its cases and templates from the tree.
set_property(TEST test_chat_conformance APPEND PROPERTY ENVIRONMENT "KEEL_TESTDATA=${PROJECT_SOURCE_DIR}/tests/data")
# test_toolcall_detect checks the format detected for each of those templates.
set_property(TEST test_toolcall_detect APPEND PROPERTY ENVIRONMENT "KEEL_TESTDATA=${PROJECT_SOURCE_DIR}/tests/data")
# The template tests render some of those templates, where llama.cpp departs
# from jinja2.
set_property(TEST test_chat_template APPEND PROPERTY ENVIRONMENT "KEEL_TESTDATA=${PROJECT_SOURCE_DIR}/tests/data")
