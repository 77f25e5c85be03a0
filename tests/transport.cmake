# Transport suites under mpirun (ctest label "mpi"): every operation on every
# group, exact byte counts per link class, errors and timeouts for each
# layout below (ZPP_TOPO emulates the nodes on this machine); the cases
# that mostly wait run only on the layouts named further down; then the
# emulated-link timing on two layouts.  tests/CMakeLists.txt includes this.
if(ZPP_WITH_MPI_ENABLED)
  add_executable(test_transport test_transport.cc)
  target_link_libraries(test_transport PRIVATE zpp_static GTest::gtest MPI::MPI_C)
  target_include_directories(test_transport PRIVATE ${PROJECT_SOURCE_DIR}/src)
  # The C API of MPI only (no C++ bindings to link).
  target_compile_definitions(test_transport PRIVATE
    ZPP_HAVE_CUDA=$<BOOL:${ZPP_HAVE_CUDA_RT}> OMPI_SKIP_MPICXX=1
    MPICH_SKIP_MPICXX=1)
  if(ZPP_WITH_CUDA_ENABLED)
    target_include_directories(test_transport PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  endif()

  # Oversubscribed ranks must not spin: Open MPI yields when idle, and zpp
  # sleeps between polls.
  set(_zpp_mpi_env "OMPI_MCA_mpi_yield_when_idle=1;OMPI_MCA_rmaps_base_oversubscribe=1")
  function(zpp_add_mpi_test name np)
    add_test(NAME ${name} COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root
      --oversubscribe --bind-to none -np ${np} $<TARGET_FILE:test_transport> ${ARGN})
    set_tests_properties(${name} PROPERTIES LABELS mpi TIMEOUT 120
      PROCESSORS 2 ENVIRONMENT "${_zpp_mpi_env};${ZPP_TEST_ENV}")
  endfunction()

  # The cases that mostly wait (a timeout waited out, late ranks slept
  # for: about 3.5 s of each entry; with UCX also the timeout of up to
  # 2 s of Xop.RanksPassingDifferentSizesFailWithMismatch) run on one node (1x4),
  # two levels (2x2, which test-asan-mpi and test-tsan also run), two
  # levels in chunks (2x4) and uneven nodes (uneven_3_2) with MPI, and on
  # 2x4_rings4 and uneven_3_2 with UCX; the other layouts leave them out.
  set(_zpp_waits ":Errors.TimeoutInsteadOfHanging:Errors.HugeTimeoutIsNoTimeout")
  string(APPEND _zpp_waits ":Threads.IdleAndLateWaitsUseLittleCpu")
  # name, ranks, ZPP_TOPO ("" = discovered: one node)
  set(_zpp_layouts
    "1x4|4|1x4" "2x2|4|2x2" "2x4|8|2x4" "4x2|8|4x2" "3x2|6|3x2"
    "uneven_3_2|5|0,0,0,1,1" "roundrobin_2x2|4|0,1,0,1" "discovered|3|")
  foreach(_l ${_zpp_layouts})
    string(REPLACE "|" ";" _f "${_l}")
    list(GET _f 0 _name)
    list(GET _f 1 _np)
    list(LENGTH _f _nf)
    set(ZPP_TEST_ENV "")
    if(_nf GREATER 2)
      list(GET _f 2 _topo)
      if(NOT _topo STREQUAL "")
        set(ZPP_TEST_ENV "ZPP_TOPO=${_topo}")
      endif()
    endif()
    # Two layouts cut the hierarchical all-gather and reduce-scatter in
    # small chunks (up to 8: the pipelined rounds), the others run whole.
    if(_name STREQUAL "2x4")
      list(APPEND ZPP_TEST_ENV "ZPP_HIER_CHUNK=1000")
    elseif(_name STREQUAL "uneven_3_2")
      list(APPEND ZPP_TEST_ENV "ZPP_HIER_CHUNK=64")
    endif()
    set(_w "")
    if(NOT _name MATCHES "^(1x4|2x2|2x4|uneven_3_2)$")
      set(_w "${_zpp_waits}")
    endif()
    zpp_add_mpi_test(transport_mpi_${_name} ${_np} --gtest_filter=-Emu.*${_w})
  endforeach()

  # The flat algorithms (ZPP_ALGO=flat: ring all-gather, pairwise
  # reduce-scatter, what zpp ran before the hierarchical default) on the
  # multi-node layouts, and the hierarchical ones on more uneven nodes
  # (2 + 3 + 2; 3 + 2 + 1, a node of one): data and byte formulas.
  foreach(_l "flat_2x4|8|2x4|flat" "flat_3x2|6|3x2|flat" "flat_uneven_3_2|5|0,0,0,1,1|flat"
             "flat_roundrobin_2x2|4|0,1,0,1|flat" "uneven_2_3_2|7|0,0,1,1,1,2,2|hier"
             "uneven_3_2_1|6|0,0,0,1,1,2|hier")
    string(REPLACE "|" ";" _f "${_l}")
    list(GET _f 0 _name)
    list(GET _f 1 _np)
    list(GET _f 2 _topo)
    list(GET _f 3 _algo)
    set(ZPP_TEST_ENV "ZPP_TOPO=${_topo};ZPP_ALGO=${_algo};ZPP_HIER_CHUNK=100")
    zpp_add_mpi_test(transport_mpi_${_name} ${_np}
      --gtest_filter=Ops.*:Stats.*:Config.*:Xop.SeveralInFlight*)
  endforeach()

  # Inter-node transfers cut in messages of ZPP_NET_SEGMENT bytes (set, it
  # applies on an emulated topology too; unset, only real inter-node links
  # are cut, as on the namespace cluster of tests/cluster_tests.sh): the
  # same data and the same counts, hierarchical and flat, uneven nodes.
  foreach(_l "2x4_seg|8|2x4|hier" "uneven_3_2_seg|5|0,0,0,1,1|flat")
    string(REPLACE "|" ";" _f "${_l}")
    list(GET _f 0 _name)
    list(GET _f 1 _np)
    list(GET _f 2 _topo)
    list(GET _f 3 _algo)
    set(ZPP_TEST_ENV "ZPP_TOPO=${_topo};ZPP_ALGO=${_algo};ZPP_NET_SEGMENT=4096")
    zpp_add_mpi_test(transport_mpi_${_name} ${_np}
      --gtest_filter=Ops.*:Stats.*:Xop.SeveralInFlight*)
  endforeach()
  # ZPP_NET_SEGMENT that differs across ranks, or out of range on all or on
  # one rank: every rank fails naming it, none waits (the launcher sets it
  # per rank: the test never changes its own environment).
  set(_mpmd ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe --bind-to none)
  foreach(_l "mismatch|mismatch|8192||ZPP_NET_SEGMENT: rank"
             "invalid_one_rank|invalid|100||ZPP_NET_SEGMENT 100"
             "invalid_minus1|invalid|-1|-1|ZPP_NET_SEGMENT -1"
             "invalid_huge|invalid|1073741825|1073741825|ZPP_NET_SEGMENT 1073741825")
    string(REPLACE "|" ";" _f "${_l}")
    list(GET _f 0 _name)
    list(GET _f 1 _case)
    list(GET _f 2 _v0)
    list(GET _f 3 _v1)
    list(GET _f 4 _want)
    set(_x1)
    if(NOT _v1 STREQUAL "")
      set(_x1 -x ZPP_NET_SEGMENT=${_v1})
    endif()
    add_test(NAME transport_netseg_${_name} COMMAND ${_mpmd}
      -np 1 -x ZPP_NET_SEGMENT=${_v0} $<TARGET_FILE:test_transport> :
      -np 1 ${_x1} $<TARGET_FILE:test_transport>)
    set_tests_properties(transport_netseg_${_name} PROPERTIES LABELS mpi TIMEOUT 60
      ENVIRONMENT "ZPP_TOPO=2x1;ZPP_TEST_NETSEG_CASE=${_case};ZPP_TEST_NETSEG_EXPECT=${_want};OMPI_MCA_mpi_yield_when_idle=1")
  endforeach()

  # ZPP_QGZ_SUM (qgZ's default reduction) is read at creation and must
  # agree (the ranks would otherwise exchange different messages) and be
  # float or int: the same cases through the same check.
  foreach(_l "mismatch|mismatch|int|float|ZPP_QGZ_SUM: rank"
             "invalid|invalid|float|bogus|ZPP_QGZ_SUM \"bogus\": must be float or int")
    string(REPLACE "|" ";" _f "${_l}")
    list(GET _f 0 _name)
    list(GET _f 1 _case)
    list(GET _f 2 _v0)
    list(GET _f 3 _v1)
    list(GET _f 4 _want)
    add_test(NAME transport_qgzsum_${_name} COMMAND ${_mpmd}
      -np 1 -x ZPP_QGZ_SUM=${_v0} $<TARGET_FILE:test_transport> :
      -np 1 -x ZPP_QGZ_SUM=${_v1} $<TARGET_FILE:test_transport>)
    set_tests_properties(transport_qgzsum_${_name} PROPERTIES LABELS mpi TIMEOUT 60
      ENVIRONMENT "ZPP_TOPO=2x1;ZPP_TEST_NETSEG_CASE=${_case};ZPP_TEST_NETSEG_EXPECT=${_want};OMPI_MCA_mpi_yield_when_idle=1")
  endforeach()

  # Several rotated rings (ZPP_NET_RINGS): same data, counts per ring.
  foreach(_l "2x4_rings4|8|2x4|4" "uneven_3_2_rings3|5|0,0,0,1,1|3"
             "roundrobin_2x2_rings2|4|0,1,0,1|2")
    string(REPLACE "|" ";" _f "${_l}")
    list(GET _f 0 _name)
    list(GET _f 1 _np)
    list(GET _f 2 _topo)
    list(GET _f 3 _rings)
    set(ZPP_TEST_ENV "ZPP_TOPO=${_topo};ZPP_NET_RINGS=${_rings}")
    zpp_add_mpi_test(transport_mpi_${_name} ${_np} --gtest_filter=Ops.*:Stats.*:Xop.SeveralInFlight*:Xop.TwoOnOnePair*)
  endforeach()

  # The same suite on the UCX transport (MPI bootstrap): ZPP_BACKEND=ucx.
  foreach(_l "2x2|4|2x2|1" "uneven_3_2|5|0,0,0,1,1|1" "roundrobin_2x2|4|0,1,0,1|1"
             "2x4_rings4|8|2x4|4")
    string(REPLACE "|" ";" _f "${_l}")
    list(GET _f 0 _name)
    list(GET _f 1 _np)
    list(GET _f 2 _topo)
    list(GET _f 3 _rings)
    set(ZPP_TEST_ENV "ZPP_BACKEND=ucx;ZPP_TOPO=${_topo};ZPP_NET_RINGS=${_rings}")
    set(_w "")
    if(_name MATCHES "^(2x2|roundrobin_2x2)$")
      set(_w "${_zpp_waits}:Xop.RanksPassingDifferentSizesFailWithMismatch")
    endif()
    zpp_add_mpi_test(transport_ucx_${_name} ${_np} --gtest_filter=-Emu.*:Device.*${_w})
  endforeach()
  # 0.25 Gbit/s: the emulated link must be slower than the real one, and
  # UCX on this machine (cma,self fails at endpoint creation here) moved
  # 37 MB between two ranks in about 0.3 s with the cores busy, as long as
  # the 1 Gbit/s emulation: the ranks then had nothing left to sleep.
  set(ZPP_TEST_ENV "ZPP_BACKEND=ucx;ZPP_TOPO=2x2;ZPP_EMU_INTER_GBIT=0.25;ZPP_EMU_INTER_LAT_US=200")
  zpp_add_mpi_test(transport_emu_ucx_2x2 4 --gtest_filter=Emu.*)

  # Emulated links: 1 Gbit/s per rank and 200 us latency between nodes.
  foreach(_l "2x2|4|2x2" "uneven_3_2|5|0,0,0,1,1")
    string(REPLACE "|" ";" _f "${_l}")
    list(GET _f 0 _name)
    list(GET _f 1 _np)
    list(GET _f 2 _topo)
    set(ZPP_TEST_ENV "ZPP_TOPO=${_topo};ZPP_EMU_INTER_GBIT=1;ZPP_EMU_INTER_LAT_US=200")
    zpp_add_mpi_test(transport_emu_${_name} ${_np} --gtest_filter=Emu.*:Topology.*)
  endforeach()
endif()
