# The chat conformance suite reads its cases and templates from the tree.
set_property(TEST test_chat_conformance APPEND PROPERTY ENVIRONMENT "KEEL_TESTDATA=${PROJECT_SOURCE_DIR}/tests/data")
