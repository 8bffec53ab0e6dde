# test_jsts reads JSON-Schema-Test-Suite's draft 2020-12 files from the tree
# (tests/data/jsts, tools/grammar/extract_jsts.py) and runs the keel CLI
# (KEEL_BIN, set for every test) on a sample of them: build keel first.
set_property(TEST test_jsts APPEND PROPERTY ENVIRONMENT "KEEL_TESTDATA=${PROJECT_SOURCE_DIR}/tests/data")
