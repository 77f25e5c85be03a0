# A short soak (perf/zpp_soak.c, 300 iterations of qwZ + hpZ + qgZ with
# error feedback on 2x4): RSS flat within 1%, no thread or descriptor
# growth, scratch cache bounded and everything given back by
# zpp_comm_destroy.  perf/soak.sh runs the 10,000-iteration version.
# 8192 elements per rank: the scratch cache (~340 KB) then stands well
# above what Open MPI's allocations leave (5 to 60 KB), so a cache that
# destroy left behind fails the run (4 s on 2 cores).
if(TARGET zpp-soak)
  add_test(NAME soak_2x4_short
    COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
      --mca btl self,vader --bind-to none -np 8 $<TARGET_FILE:zpp-soak>
      --iters 300 --count 8192 --sample 3 --check 15 --warmup 6)
  set_tests_properties(soak_2x4_short PROPERTIES LABELS mpi TIMEOUT 120
    ENVIRONMENT "ZPP_TOPO=2x4;OMPI_MCA_mpi_yield_when_idle=1")
endif()
