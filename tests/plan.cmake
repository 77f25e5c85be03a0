# zpp-plan run as a user would (--format json) against hand-computed cases.
# tests/CMakeLists.txt includes this fragment.
if(TARGET zpp-plan)
  zpp_add_gtest(test_plan)
  target_compile_definitions(test_plan PRIVATE
    ZPP_PLAN_BIN="$<TARGET_FILE:zpp-plan>")
  add_dependencies(test_plan zpp-plan)
endif()
