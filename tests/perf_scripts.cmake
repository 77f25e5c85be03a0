# perf/ scripts run with stand-ins for the programs they drive (seconds;
# no build needed): tests/convergence_study_test.sh,
# tests/cluster_train_test.sh, tests/bandwidth_train_table_test.sh,
# tests/bandwidth_study_timeout_test.sh, tests/cluster_ab_test.sh,
# tests/softirq_wait_test.sh, tests/gloo_peer_study_test.sh.  Label
# "scripts" (run by `make test`'s ctest of the build tree, not again under
# ASan).
add_test(NAME convergence_study_script
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/convergence_study_test.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(convergence_study_script PROPERTIES LABELS scripts TIMEOUT 180)

# perf/cluster_train.sh with a stand-in cluster script and zpp-train
# (about 20 s: two 2 s waits it must make, a timeout, TERMs during a
# launch, a load wait and a lock wait, a HUP, launches discarded for
# ksoftirqd's run-queue wait)
add_test(NAME cluster_train_script
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cluster_train_test.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(cluster_train_script PROPERTIES LABELS scripts TIMEOUT 180)

# perf/bandwidth_study.sh's training table (medians over the alternated
# repetitions) from a CSV of random step times (about 3 s)
add_test(NAME bandwidth_train_table
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/bandwidth_train_table_test.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(bandwidth_train_table PROPERTIES LABELS scripts TIMEOUT 120)

# perf/bandwidth_study.sh kills a hung launch after ZPP_STUDY_RUN_TIMEOUT_S
# and goes on (a stand-in mpirun that hangs; about 15 s: 7 launches of 2 s)
add_test(NAME bandwidth_study_timeout
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/bandwidth_study_timeout_test.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(bandwidth_study_timeout PROPERTIES LABELS scripts TIMEOUT 120)

# perf/cluster_ab.sh's table (perf/cluster_ab_table.py) from a CSV of
# random times, and the script's refusals before it makes a cluster
# (about 1 s)
add_test(NAME cluster_ab_script
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cluster_ab_test.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(cluster_ab_script PROPERTIES LABELS scripts TIMEOUT 60)

# scripts/softirq_wait.sh on a fake proc root: a launch during which
# ksoftirqd waited more than the limit is run again, at most
# ZPP_SOFTIRQ_TRIES times, then a clear error (about 3 s)
add_test(NAME softirq_wait_script
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/softirq_wait_test.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(softirq_wait_script PROPERTIES LABELS scripts TIMEOUT 60)

# perf/gloo_peer_study.sh on a copy with a stand-in cluster script: its
# refusals of bad settings before any cluster, one launch per (layout,
# rate, size), a wrong output's rows kept and a failure status, the
# printed commands rerunning the same launches (about 3 s)
add_test(NAME gloo_peer_study_script
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/gloo_peer_study_test.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(gloo_peer_study_script PROPERTIES LABELS scripts TIMEOUT 60)
