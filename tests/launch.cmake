# (Named launch.cmake so it is included after coll.cmake, which defines test_coll.)
# zpp without mpirun (docs/design.md, "Bootstrap"): the TCP bootstrap,
# communicators of rank lists and the UCX transport.
#   test_bootstrap       unique ids (good, malformed, stale), a caller's
#                        bootstrap table, subsets over TCP (fork, no MPI);
#   coll_env_*           tests/test_coll.cc started like torchrun does
#                        (tests/launch_env.py: environment only, loopback)
#                        over UCX on an emulated 2x2, and on subsets;
#   coll_mpi_ucx_2x2     the same suite under mpirun: MPI bootstrap, UCX;
#   coll_subset_mpi_2x4  the suite on communicators of rank lists (MPI);
#   bootstrap_bad_*      bad launches: every process fails within
#                        ZPP_TIMEOUT_S (3 s here) with an error naming the
#                        problem, none hangs.
zpp_add_gtest(test_bootstrap)

find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND AND TARGET test_coll)
  set(_launch ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/launch_env.py)
  set(_env_common "OMPI_MCA_mpi_yield_when_idle=1")
  add_test(NAME coll_env_ucx_2x2
    COMMAND ${_launch} -n 4 --timeout 150 -- $<TARGET_FILE:test_coll>)
  set_tests_properties(coll_env_ucx_2x2 PROPERTIES LABELS bootstrap TIMEOUT 180
    PROCESSORS 2 ENVIRONMENT "ZPP_TOPO=2x2;${_env_common}")
  add_test(NAME coll_env_subset_ucx_2x4
    COMMAND ${_launch} -n 8 --timeout 150 -- $<TARGET_FILE:test_coll>
      --gtest_filter=Baseline.*:Qwz.*:Hpz.*:Qgz.CountsEqualTheFormulas:Qgz.NonFinite*)
  set_tests_properties(coll_env_subset_ucx_2x4 PROPERTIES LABELS bootstrap
    TIMEOUT 180 PROCESSORS 2
    ENVIRONMENT "ZPP_TOPO=2x4;ZPP_TEST_SUBSET=1;${_env_common}")
  add_test(NAME coll_env_check
    COMMAND ${_launch} -n 4 --timeout 100 -- $<TARGET_FILE:test_coll>
      --gtest_filter=BadInput.*)
  set_tests_properties(coll_env_check PROPERTIES LABELS bootstrap TIMEOUT 120
    ENVIRONMENT "ZPP_TOPO=2x2;ZPP_CHECK=1;${_env_common}")

  # The tools over the TCP bootstrap: their headers name it and the backend.
  add_test(NAME tools_env_zpp_topo
    COMMAND ${_launch} -n 4 --timeout 60
      --expect-output "\"bootstrap\": \"tcp\", \"backend\": \"ucx\""
      -- $<TARGET_FILE:zpp-topo> --json)
  add_test(NAME tools_env_zpp_bench
    COMMAND ${_launch} -n 4 --timeout 100
      --expect-output "backend ucx, bootstrap tcp"
      -- $<TARGET_FILE:zpp-bench> --coll reducescatter -b 4K -e 16K -n 2 -w 1
        --format csv)
  set_tests_properties(tools_env_zpp_topo tools_env_zpp_bench PROPERTIES
    LABELS "bootstrap;tools" TIMEOUT 120 ENVIRONMENT "ZPP_TOPO=2x2")

  # Bad launches: name, processes, expected output, then launcher flags.
  function(zpp_bad_launch name n want)
    add_test(NAME bootstrap_bad_${name}
      COMMAND ${_launch} -n ${n} ${ARGN} --timeout 30 --within 6
        --expect-fail ${want} -- $<TARGET_FILE:test_coll>)
    set_tests_properties(bootstrap_bad_${name} PROPERTIES LABELS bootstrap
      TIMEOUT 60 ENVIRONMENT "ZPP_TIMEOUT_S=3;OMPI_MCA_mpi_yield_when_idle=1")
  endfunction()
  zpp_bad_launch(never_arrives 3 "rank 3 never arrived" --world 4)
  zpp_bad_launch(rank_out_of_range 4 "RANK 7: must be in .0, WORLD_SIZE = 4"
    --ranks 0,1,2,7 --world 4)
  zpp_bad_launch(rank_claimed_twice 4 "rank 1 claimed by two processes"
    --ranks 0,1,1,3)
  # rank 0 cannot listen; the others reach a process that never answers
  zpp_bad_launch(port_in_use 3
    "already in use|||not a zpp bootstrap root|||not a zpp bootstrap root"
    --hold-port)
endif()

if(TARGET test_coll)
  set(_zpp_mpirun_b ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
    --mca btl self,vader --bind-to none)
  add_test(NAME coll_mpi_ucx_2x2
    COMMAND ${_zpp_mpirun_b} -np 4 $<TARGET_FILE:test_coll>)
  set_tests_properties(coll_mpi_ucx_2x2 PROPERTIES LABELS "mpi;bootstrap"
    TIMEOUT 180 PROCESSORS 2
    ENVIRONMENT "ZPP_TOPO=2x2;ZPP_BACKEND=ucx;OMPI_MCA_mpi_yield_when_idle=1")
  # zpp-bench under mpirun on the UCX transport (MPI bootstrap).
  if(COMMAND zpp_bench_test)
    zpp_bench_test(bench_allgather_ucx_2x2 4 2x2
      "--coll;allgather;--backend;ucx;-b;1K;-e;64K;-f;4;-n;2;-w;1;--format;csv")
  endif()
  add_test(NAME coll_subset_mpi_2x4
    COMMAND ${_zpp_mpirun_b} -np 8 $<TARGET_FILE:test_coll>
      --gtest_filter=Baseline.*:Qwz.*:Hpz.*:Qgz.CountsEqualTheFormulas:Qgz.NonFinite*)
  set_tests_properties(coll_subset_mpi_2x4 PROPERTIES LABELS "mpi;bootstrap"
    TIMEOUT 180 PROCESSORS 2
    ENVIRONMENT "ZPP_TOPO=2x4;ZPP_TEST_SUBSET=1;OMPI_MCA_mpi_yield_when_idle=1")
endif()
