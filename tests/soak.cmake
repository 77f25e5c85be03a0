# A short soak (perf/zpp_soak.c, 300 iterations of qwZ + hpZ + qgZ with
# error feedback on 2x4): RSS flat within 1%, no thread or descriptor
# growth, scratch cache bounded and everything given back by
# zpp_comm_destroy.  perf/soak.sh runs the 10,000-iteration version.
if(TARGET zpp-soak)
  add_test(NAME soak_2x4_short
    COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
      --mca btl self,vader --bind-to none -np 8 $<TARGET_FILE:zpp-soak>
      --iters 300 --sample 3 --check 15 --warmup 6)
  set_tests_properties(soak_2x4_short PROPERTIES LABELS mpi TIMEOUT 120
    ENVIRONMENT "ZPP_TOPO=2x4;OMPI_MCA_mpi_yield_when_idle=1")
endif()
