# Topology suites: the node map in one process (test_topo, label unit),
# and zpp-topo's output (label tools).  tests/CMakeLists.txt includes this.
zpp_add_gtest(test_topo)
