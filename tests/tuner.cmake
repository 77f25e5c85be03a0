# ZPP_ALGO=auto (src/algo/tune.c) under mpirun: the model's unit tests,
# then on each layout every rank's choice alike, each choice's bytes and
# exact result; tuner files that force a family; creation that must fail
# (a bad tuner file, ZPP_ALGO or ZPP_TUNER_FILE that differ between ranks).
# tests/CMakeLists.txt includes this.
if(ZPP_WITH_MPI_ENABLED)
  add_executable(test_tuner test_tuner.cc tuner_whitebox.c)
  target_link_libraries(test_tuner PRIVATE zpp_static GTest::gtest MPI::MPI_C)
  target_include_directories(test_tuner PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(test_tuner PRIVATE
    ZPP_HAVE_CUDA=$<BOOL:${ZPP_HAVE_CUDA_RT}> OMPI_SKIP_MPICXX=1
    MPICH_SKIP_MPICXX=1)
  if(ZPP_WITH_CUDA_ENABLED)
    target_include_directories(test_tuner PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  endif()
  set(_tf ${CMAKE_CURRENT_SOURCE_DIR}/tuner)
  set(_tenv "OMPI_MCA_mpi_yield_when_idle=1;OMPI_MCA_rmaps_base_oversubscribe=1")
  # name | ranks | environment (comma-separated)
  foreach(_l "1x4|4|ZPP_TOPO=1x4"
             "2x2|4|ZPP_TOPO=2x2"
             "2x4|8|ZPP_TOPO=2x4"
             "uneven_3_1|4|ZPP_TOPO=0,0,0,1"
             "2x4_emu|8|ZPP_TOPO=2x4,ZPP_EMU_INTER_GBIT=0.4,ZPP_EMU_INTER_LAT_US=200"
             "2x4_probe|8|ZPP_TOPO=2x4,ZPP_TUNER_PROBE=1"
             "2x4_emu_probe|8|ZPP_TOPO=2x4,ZPP_TUNER_PROBE=1,ZPP_EMU_INTER_GBIT=2,ZPP_EMU_INTER_LAT_US=50"
             "uneven_3_1_probe|4|ZPP_TOPO=0,0,0,1,ZPP_TUNER_PROBE=1"
             "2x4_file_slow|8|ZPP_TOPO=2x4,ZPP_TUNER_FILE=${_tf}/slow_link.txt"
             "2x4_chunk|8|ZPP_TOPO=2x4,ZPP_EMU_INTER_GBIT=10,ZPP_HIER_CHUNK=4096"
             "2x4_force_hier|8|ZPP_TOPO=2x4,ZPP_TUNER_FILE=${_tf}/force_hier.txt,ZPP_TEST_TUNER_EXPECT=hier"
             "uneven_3_1_force_hier|4|ZPP_TOPO=0,0,0,1,ZPP_TUNER_FILE=${_tf}/force_hier.txt,ZPP_TEST_TUNER_EXPECT=hier"
             "2x2_force_flat|4|ZPP_TOPO=2x2,ZPP_TUNER_FILE=${_tf}/force_flat.txt,ZPP_TEST_TUNER_EXPECT=flat")
    string(REPLACE "|" ";" _f "${_l}")
    list(GET _f 0 _name)
    list(GET _f 1 _np)
    list(GET _f 2 _env)
    string(REPLACE "," ";" _env "${_env}")
    # ZPP_TOPO's own commas: put back the rank lists
    string(REGEX REPLACE "ZPP_TOPO=0;0;0;1" "ZPP_TOPO=0,0,0,1" _env "${_env}")
    set(_filter "Auto.*")
    if(_name STREQUAL "2x2")
      set(_filter "*")  # the model's and the parser's unit tests once
    endif()
    add_test(NAME tuner_mpi_${_name} COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root
      --oversubscribe --bind-to none -np ${_np} $<TARGET_FILE:test_tuner>
      --gtest_filter=${_filter})
    set_tests_properties(tuner_mpi_${_name} PROPERTIES LABELS mpi TIMEOUT 180
      PROCESSORS 2 ENVIRONMENT "${_tenv};${_env}")
  endforeach()

  # Creation that must fail on every rank, naming the setting (the
  # launcher sets it per rank).
  set(_mpmd ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe --bind-to none)
  foreach(_l "algo_mismatch|MISMATCH|ZPP_ALGO=hier|ZPP_ALGO=auto|ZPP_ALGO: rank"
             "algo_mismatch_default|MISMATCH|ZPP_ALGO=flat|ZPP_ALGO=|ZPP_ALGO: rank"
             "file_mismatch|MISMATCH|ZPP_TUNER_FILE=${_tf}/force_hier.txt|ZPP_TUNER_FILE=${_tf}/force_flat.txt|ZPP_TUNER_FILE: rank"
             "file_missing_one_rank|MISMATCH|ZPP_TUNER_FILE=${_tf}/force_hier.txt|ZPP_TUNER_FILE=|ZPP_TUNER_FILE: rank"
             "file_bad_one_rank|IO|ZPP_TUNER_FILE=${_tf}/force_hier.txt|ZPP_TUNER_FILE=${_tf}/bad_key.txt|line 3: unknown key \"inter_gbitt\""
             "file_absent|IO|ZPP_TUNER_FILE=${_tf}/absent.txt|ZPP_TUNER_FILE=${_tf}/absent.txt|absent.txt: No such file"
             "algo_invalid|INVALID|ZPP_ALGO=fastest|ZPP_ALGO=auto|ZPP_ALGO \"fastest\": must be auto, hier or flat"
             "probe_mismatch|MISMATCH|ZPP_TUNER_PROBE=1|ZPP_TUNER_PROBE=0|ZPP_TUNER_PROBE: rank"
             "rings_mismatch|MISMATCH|ZPP_NET_RINGS=2|ZPP_NET_RINGS=1|ZPP_NET_RINGS: rank")
    string(REPLACE "|" ";" _f "${_l}")
    list(GET _f 0 _name)
    list(GET _f 1 _case)
    list(GET _f 2 _v0)
    list(GET _f 3 _v1)
    list(GET _f 4 _want)
    add_test(NAME tuner_create_${_name} COMMAND ${_mpmd}
      -np 1 -x ${_v0} $<TARGET_FILE:test_tuner> :
      -np 1 -x ${_v1} $<TARGET_FILE:test_tuner>)
    set_tests_properties(tuner_create_${_name} PROPERTIES LABELS mpi TIMEOUT 60
      ENVIRONMENT "ZPP_TOPO=2x1;ZPP_TEST_CREATE_CASE=${_case};ZPP_TEST_CREATE_EXPECT=${_want};OMPI_MCA_mpi_yield_when_idle=1")
  endforeach()
endif()
