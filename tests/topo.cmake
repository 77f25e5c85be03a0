# Topology suites: the node map in one process (test_topo, label unit),
# and zpp-topo's output (label tools).  tests/CMakeLists.txt includes this.
zpp_add_gtest(test_topo)

# zpp-topo run as a user would (label unit; the live cases start mpirun).
if(TARGET zpp-topo)
  zpp_add_gtest(test_topo_tool)
  target_compile_definitions(test_topo_tool PRIVATE
    ZPP_TOPO_BIN="$<TARGET_FILE:zpp-topo>")
  if(ZPP_WITH_MPI_ENABLED AND MPIEXEC_EXECUTABLE)
    target_compile_definitions(test_topo_tool PRIVATE
      ZPP_MPIEXEC="${MPIEXEC_EXECUTABLE}")
  endif()
  add_dependencies(test_topo_tool zpp-topo)
endif()
