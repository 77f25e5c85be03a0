# The layers of src/ (docs/design.md, "Layers"): no include goes up a
# layer, no include cycle, no hand-written prototype; with the objects of
# this build, no call goes up a layer either.  The second test makes each
# kind of violation in a scratch copy and expects the check to refuse it.
if(TARGET zpp_objects AND NOT ZPP_CUDA_EMU)
  add_test(NAME layers_check
    COMMAND ${PROJECT_SOURCE_DIR}/tools/check_layers.sh
      --objects ${PROJECT_BINARY_DIR}/CMakeFiles/zpp_objects.dir ${PROJECT_SOURCE_DIR})
  set_tests_properties(layers_check PROPERTIES LABELS unit TIMEOUT 120)
endif()
add_test(NAME layers_check_refuses
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_layers_test.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(layers_check_refuses PROPERTIES LABELS unit TIMEOUT 120)
# docs/design.md's layer diagram is the script's (--diagram).
add_test(NAME layers_diagram
  COMMAND ${CMAKE_COMMAND} -DROOT=${PROJECT_SOURCE_DIR}
    -P ${PROJECT_SOURCE_DIR}/cmake/check_layers_diagram.cmake)
set_tests_properties(layers_diagram PROPERTIES LABELS docs TIMEOUT 60)
