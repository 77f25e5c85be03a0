# Fails unless docs/runtime.md contains tests/runtime/example.c verbatim
# (the example in the doc is the one that is compiled and run).
# Run: cmake -DDOC=<runtime.md> -DEXAMPLE=<example.c> -P check_doc_example.cmake
file(READ ${DOC} _doc)
file(READ ${EXAMPLE} _ex)
string(FIND "${_doc}" "${_ex}" _at)
if(_at EQUAL -1)
  message(FATAL_ERROR "${DOC} does not contain ${EXAMPLE} verbatim: paste the file into its ```c block")
endif()
message(STATUS "${DOC} contains ${EXAMPLE} verbatim")
