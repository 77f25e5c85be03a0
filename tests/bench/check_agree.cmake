# Runs zpp-bench under mpirun with the ranks split in two halves that see
# different environments (MPMD: -np HALF env ENV BENCH ARGS : -np HALF
# BENCH ARGS) and checks that every rank ends, within BOUND seconds, with
# the exit status EXPECT_RC and a line naming the failure (cmake -P script,
# called by tests/bench.cmake).  Variables:
#   MPIEXEC     mpirun and its flags, joined with '|'
#   NP          ranks (even: two halves)
#   BENCH       the zpp-bench executable
#   ARGS        its arguments, joined with '|'
#   ENV         NAME=VALUE for the first half only
#   EXPECT_RC   expected exit status
#   EXPECT_ERR  regular expression every rank's line must match after
#               "zpp-bench: rank <r>: "
#   BOUND       seconds before the run counts as hung
cmake_minimum_required(VERSION 3.24)

string(REPLACE "|" ";" MPIEXEC "${MPIEXEC}")
string(REPLACE "|" ";" ARGS "${ARGS}")
math(EXPR _half "${NP} / 2")
math(EXPR _backstop "${BOUND} + 10")
# timeout(1) sends mpirun SIGTERM, which ends its ranks too
execute_process(COMMAND timeout -k 5 ${BOUND} ${MPIEXEC} -np ${_half}
  env ${ENV} ${BENCH} ${ARGS} : -np ${_half} ${BENCH} ${ARGS}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
  TIMEOUT ${_backstop})
message(STATUS "zpp-bench stderr:\n${err}")
if(rc EQUAL 124 OR rc EQUAL 137 OR NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "the run did not end within ${BOUND} s (${rc})")
endif()
if(NOT rc EQUAL EXPECT_RC)
  message(FATAL_ERROR "exit status ${rc}, expected ${EXPECT_RC}")
endif()
math(EXPR _last "${NP} - 1")
foreach(_r RANGE ${_last})
  if(NOT err MATCHES "zpp-bench: rank ${_r}: ${EXPECT_ERR}")
    message(FATAL_ERROR "rank ${_r} printed no line matching '${EXPECT_ERR}'")
  endif()
endforeach()
