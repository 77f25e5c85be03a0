# Tests of the command-line tools (ctest label "tools"); tests/CMakeLists.txt
# includes every *.cmake fragment here, in its own directory scope.
if(TARGET zpp-quant-error)
  zpp_add_gtest(test_quant_error)
  # The test runs the built tool as a user would.
  target_compile_definitions(test_quant_error PRIVATE
    ZPP_QUANT_ERROR_BIN="$<TARGET_FILE:zpp-quant-error>")
  add_dependencies(test_quant_error zpp-quant-error)
  # zpp_add_gtest labels what it discovers "unit" and takes no label
  # argument.  Add "tools" once the tests are discovered:
  # gtest_discover_tests leaves their names in test_quant_error_TESTS (its
  # TEST_LIST default), ctest reads TEST_INCLUDE_FILES in order, after the
  # discovery file, and appends the label, so the tests carry "unit;tools"
  # (they take well under a second, so "ctest -L unit" may keep them).
  set(_zpp_relabel ${CMAKE_CURRENT_BINARY_DIR}/test_quant_error_labels.cmake)
  file(WRITE ${_zpp_relabel}
    "if(test_quant_error_TESTS)\n"
    "  set_tests_properties(\${test_quant_error_TESTS} PROPERTIES LABELS tools)\n"
    "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${_zpp_relabel})
endif()
