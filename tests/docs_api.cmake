# docs/api.md must name every function the public headers export.
add_test(NAME docs_api_complete
  COMMAND ${CMAKE_COMMAND} -DROOT=${PROJECT_SOURCE_DIR}
    -P ${PROJECT_SOURCE_DIR}/cmake/check_docs_api.cmake)
set_tests_properties(docs_api_complete PROPERTIES LABELS docs)
