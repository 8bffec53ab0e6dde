# The grammar tests read llama.cpp's grammar cases and files from the tree
# (tests/data/grammar, tools/grammar/extract_llamacpp_grammar.py).
set_property(TEST test_grammar APPEND PROPERTY ENVIRONMENT "KEEL_TESTDATA=${PROJECT_SOURCE_DIR}/tests/data")
