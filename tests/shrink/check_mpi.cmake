# cmake -P driver of shrink_mpi_kill_2x2 (tests/shrink.cmake): runs the
# MPI job and passes only when mpiexec exits 0 and each of the three
# survivors printed an exact all-gather on the new communicator ("exact 1")
# and destroyed both communicators ("destroyed").
# -D MPIEXEC=... -D WORKER=... -D NP=4 -D SURVIVORS=3
execute_process(
  COMMAND ${MPIEXEC} --allow-run-as-root --oversubscribe --enable-recovery
          --mca btl self,vader --bind-to none -np ${NP} -x ZPP_TOPO ${WORKER}
  RESULT_VARIABLE rc
  OUTPUT_VARIABLE out
  ERROR_VARIABLE err)
message("${out}")
message("${err}")
string(REGEX MATCHALL "[^\n]*backend ucx bootstrap tcp allgather 0 exact 1"
       exact "${out}")
string(REGEX MATCHALL "rank [0-9]+ destroyed" destroyed "${out}")
list(LENGTH exact n_exact)
list(LENGTH destroyed n_destroyed)
if(NOT rc EQUAL 0 OR NOT n_exact EQUAL SURVIVORS OR
   NOT n_destroyed EQUAL SURVIVORS)
  message(FATAL_ERROR
    "mpiexec exited ${rc}; ${n_exact} survivors printed an exact all-gather "
    "and ${n_destroyed} destroyed their communicators, want ${SURVIVORS} "
    "each")
endif()
