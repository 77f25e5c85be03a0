# perf/ scripts run with stand-ins for the programs they drive (seconds;
# no build needed): tests/convergence_study_test.sh.  Label "scripts" (run
# by `make test`'s ctest of the build tree, not again under ASan).
add_test(NAME convergence_study_script
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/convergence_study_test.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(convergence_study_script PROPERTIES LABELS scripts TIMEOUT 180)
