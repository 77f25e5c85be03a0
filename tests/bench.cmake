# zpp-bench under mpirun (label "mpi"): each collective on small sizes for
# ZPP_TOPO=2x2 (4 ranks) and 2x4 (8 ranks), one JSON run, the checker's
# self-test (--corrupt must exit 1), without CUDA, --memory device (must
# say "no CUDA device" and exit 3), and in an emulated build, --memory
# device on the emulated CUDA runtime.  tests/bench/check_bench.cmake
# runs the benchmark and checks the exit status, the exact CSV header, and
# that baseline rows have wrong = 0 and ratio 1.
if(ZPP_WITH_MPI_ENABLED AND TARGET zpp-bench)
  set(_zpp_bench_mpirun ${MPIEXEC_EXECUTABLE} --allow-run-as-root
    --oversubscribe --mca btl self,vader --bind-to none)
  set(_zpp_bench_check ${CMAKE_CURRENT_SOURCE_DIR}/bench/check_bench.cmake)
  set(_zpp_bench_small -b 1K -e 64K -f 4 -n 2 -w 1 -c 1)

  # name, ranks, ZPP_TOPO, the benchmark's arguments (a list), then more
  # -D definitions for the script.  Lists travel joined with '|' (a ';'
  # would split the -D argument).
  function(zpp_bench_test name np topo args)
    string(REPLACE ";" "|" _mpi "${_zpp_bench_mpirun}")
    string(REPLACE ";" "|" _args "${args}")
    add_test(NAME ${name}
      COMMAND ${CMAKE_COMMAND} "-DMPIEXEC=${_mpi}" -DNP=${np}
        -DBENCH=$<TARGET_FILE:zpp-bench> -DEXPECT_TOPO=${topo}
        "-DARGS=${_args}" ${ARGN} -P ${_zpp_bench_check})
    set_tests_properties(${name} PROPERTIES LABELS mpi TIMEOUT 60
      ENVIRONMENT "ZPP_TOPO=${topo};OMPI_MCA_mpi_yield_when_idle=1")
  endfunction()

  foreach(_layout 2x2:4 2x4:8)
    string(REPLACE ":" ";" _p "${_layout}")
    list(GET _p 0 _topo)
    list(GET _p 1 _np)
    foreach(_coll allgather reducescatter hpz-gather)
      zpp_bench_test(bench_${_coll}_${_topo} ${_np} ${_topo}
        "--coll;${_coll};${_zpp_bench_small};--format;csv")
    endforeach()
  endforeach()

  # JSON, MEAN, fp16, every qgZ width and a non-default block
  set(_args --coll reducescatter --op mean --dtype fp16 --block 64
    --variant qgz4,qgz8,qgz8-4,qgz4-8,qgz16-4,qgz16-8,fp16 ${_zpp_bench_small} --format json)
  zpp_bench_test(bench_json_2x2 4 2x2 "${_args}" -DFORMAT=json)

  # The baseline of ZPP_ALGO's choice against the flat and the
  # hierarchical ones of communicators of their own in one run (the -flat
  # and -hier variants), MEAN over 6 ranks (a division that is not a
  # power of two), 3 nodes: each checked bitwise against its own summation
  # order, and each variant must have a row at every size.  Then the same
  # reduce-scatter on uneven nodes (3 + 2 ranks).
  foreach(_coll allgather reducescatter)
    zpp_bench_test(bench_${_coll}_flat_3x2 6 3x2
      "--coll;${_coll};--variant;bf16,bf16-flat,bf16-hier;--op;mean;${_zpp_bench_small};--format;csv"
      "-DEXPECT_VARIANTS=bf16|bf16-flat|bf16-hier")
  endforeach()
  zpp_bench_test(bench_reducescatter_flat_uneven_3+2 5 0,0,0,1,1
    "--coll;reducescatter;--variant;bf16,bf16-flat,bf16-hier;--op;mean;${_zpp_bench_small};--format;csv"
    "-DEXPECT_VARIANTS=bf16|bf16-flat|bf16-hier")

  # The checker must catch one spoiled element (exit 1, wrong > 0).
  set(_args --coll allgather -b 4K -e 4K -n 1 -w 0 --corrupt --format csv)
  zpp_bench_test(bench_corrupt_2x2 4 2x2 "${_args}" -DEXPECT_RC=1)

  # --interleave: the variants of a size round-robin, each round starting
  # one variant later (--trace's lines on stderr: with -w 1 -n 2, timed
  # round 0 starts at qgz4, round 1 at mpi), with their state alive at once
  # (hpZ handles), and the checker still catches a spoiled element.
  zpp_bench_test(bench_interleave_2x4 8 2x4
    "--coll;reducescatter;--variant;bf16,qgz4,mpi;--interleave;--trace;${_zpp_bench_small};--format;csv"
    "-DEXPECT_ERR=# timed qgz4 size 1024 iteration 0.*# timed mpi size 1024 iteration 0.*# timed bf16 size 1024 iteration 0.*# timed mpi size 1024 iteration 1.*# timed bf16 size 1024 iteration 1.*# timed qgz4 size 1024 iteration 1")
  # Every row's byte counts are the same in both orders.
  string(REPLACE ";" "|" _mpi "${_zpp_bench_mpirun}")
  add_test(NAME bench_interleave_bytes_2x4
    COMMAND ${CMAKE_COMMAND} "-DMPIEXEC=${_mpi}" -DNP=8
      -DBENCH=$<TARGET_FILE:zpp-bench>
      "-DARGS=--coll|reducescatter|--variant|bf16,bf16-flat,qgz4,qgz8-4,mpi|-b|4K|-e|64K|-f|16|-n|2|-w|1|-c|0"
      -P ${CMAKE_CURRENT_SOURCE_DIR}/bench/compare_interleave.cmake)
  set_tests_properties(bench_interleave_bytes_2x4 PROPERTIES LABELS mpi
    TIMEOUT 60 ENVIRONMENT "ZPP_TOPO=2x4;OMPI_MCA_mpi_yield_when_idle=1")
  zpp_bench_test(bench_interleave_hpz_2x2 4 2x2
    "--coll;hpz-gather;--interleave;${_zpp_bench_small};--format;json" -DFORMAT=json)
  set(_args --coll allgather --variant bf16,qwz8 -b 4K -e 4K -n 2 -w 0
    --interleave --corrupt --format csv)
  zpp_bench_test(bench_interleave_corrupt_2x2 4 2x2 "${_args}" -DEXPECT_RC=1)

  # Open MPI's own collectives beside zpp's (--variant mpi): bitwise
  # all-gather, reduce-scatter within the bound of any summation order
  # (bf16 and fp16 through the user-defined sums, fp32 MEAN), the checker
  # catches a spoiled element of the mpi rows too.
  zpp_bench_test(bench_mpi_allgather_2x2 4 2x2
    "--coll;allgather;--variant;bf16,mpi;${_zpp_bench_small};--format;csv")
  zpp_bench_test(bench_mpi_reducescatter_2x4 8 2x4
    "--coll;reducescatter;--variant;bf16,qgz4,qgz16-4,mpi;${_zpp_bench_small};--format;csv")
  set(_args --coll reducescatter --op mean --dtype fp16 --variant fp16,mpi
    ${_zpp_bench_small} --format json)
  zpp_bench_test(bench_mpi_fp16_mean_2x2 4 2x2 "${_args}" -DFORMAT=json)
  set(_args --coll reducescatter --op mean --dtype fp32 --variant fp32,mpi
    ${_zpp_bench_small} --format csv)
  zpp_bench_test(bench_mpi_fp32_mean_2x2 4 2x2 "${_args}")
  set(_args --coll reducescatter --variant mpi -b 4K -e 4K -n 1 -w 0 --corrupt
    --format csv)
  zpp_bench_test(bench_mpi_corrupt_2x2 4 2x2 "${_args}" -DEXPECT_RC=1)
  # On an emulated link the mpi rows are not slowed: the header says so.
  zpp_bench_test(bench_mpi_emulated_link_2x2 4 2x2
    "--coll;allgather;--variant;bf16,mpi;-b;4K;-e;4K;-n;1;-w;0;--format;csv"
    "-DEXPECT_OUT=# the mpi rows are NOT on the emulated link")
  set_tests_properties(bench_mpi_emulated_link_2x2 PROPERTIES ENVIRONMENT
    "ZPP_TOPO=2x2;ZPP_EMU_INTER_GBIT=100;OMPI_MCA_mpi_yield_when_idle=1")

  # The strongest Open MPI peers (perf/bench_mpi_peers.c): HAN and the
  # best of tuned's algorithms beside the default mpi, on the same buffers.
  # HAN selects itself only for a communicator with ranks on more than one
  # node, so this mpirun starts two made-up nodes of 2 ranks, each under a
  # daemon of its own (tests/bench/fake_node_ssh.sh as the ssh; TCP between
  # them, on loopback only: the shared-memory transport assumes one daemon
  # per host).  Rows checked (all-gather bitwise), the '# served' lines
  # must name HAN's allgather and a tuned algorithm, the mpi-best rows its
  # winner.
  set(_fake_hosts ${CMAKE_CURRENT_BINARY_DIR}/bench_fake_nodes.hosts)
  file(WRITE ${_fake_hosts} "fakenode1 slots=2\nfakenode2 slots=2\n")
  set(_fake_mpirun ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
    --hostfile ${_fake_hosts}
    --mca plm_rsh_agent ${CMAKE_CURRENT_SOURCE_DIR}/bench/fake_node_ssh.sh
    --mca btl self,tcp --mca btl_tcp_if_include lo
    --mca oob_tcp_if_include lo --bind-to none)
  string(REPLACE ";" "|" _fake_mpi "${_fake_mpirun}")
  set(_fake_env "ZPP_FAKE_NODE_DIR=${CMAKE_CURRENT_BINARY_DIR}/bench_fake_nodes")
  set(_peer_args -b 1K -e 4K -f 4 -n 2 -w 1 -c 1 --format csv)
  foreach(_coll allgather reducescatter)
    if(_coll STREQUAL "allgather")
      set(_han "# served: mpi-han size 1024 by han:allgather_[a-z]+")
    else()
      set(_han "# served: mpi-han size 1024 by tuned:[a-z_]+ \\(HAN 4.1 has no reduce_scatter_block\\)")
    endif()
    string(REPLACE ";" "|" _args
      "--coll;${_coll};--variant;bf16,mpi,mpi-han,mpi-best;${_peer_args}")
    add_test(NAME bench_mpi_peers_${_coll}_2x2
      COMMAND ${CMAKE_COMMAND} "-DMPIEXEC=${_fake_mpi}" -DNP=4
        -DBENCH=$<TARGET_FILE:zpp-bench> -DEXPECT_TOPO=2x2 "-DARGS=${_args}"
        "-DEXPECT_OUT=${_han}.*# mpi-best size 4096 \\(1 \\+ 2 calls each\\):.* -> [a-z_]+ \\(each run verified.*${_coll},mpi-best\\[[a-z_]+\\],4096,"
        -P ${_zpp_bench_check})
    set_tests_properties(bench_mpi_peers_${_coll}_2x2 PROPERTIES LABELS mpi
      TIMEOUT 60 ENVIRONMENT "ZPP_TOPO=2x2;OMPI_MCA_mpi_yield_when_idle=1;${_fake_env}")
  endforeach()
  # The checker catches a spoiled element of the mpi-han and mpi-best rows
  # (the 13th column, wrong, of each).
  set(_w "[^,]*,[^,]*,[^,]*,[^,]*,[^,]*,[^,]*,[^,]*,[^,]*,[^,]*,[1-9]")
  string(REPLACE ";" "|" _args
    "--coll;allgather;--variant;mpi-han,mpi-best;-b;4K;-e;4K;-n;1;-w;0;--corrupt;--format;csv")
  add_test(NAME bench_mpi_peers_corrupt_2x2
    COMMAND ${CMAKE_COMMAND} "-DMPIEXEC=${_fake_mpi}" -DNP=4
      -DBENCH=$<TARGET_FILE:zpp-bench> "-DARGS=${_args}" -DEXPECT_RC=1
      "-DEXPECT_OUT=allgather,mpi-han,4096,${_w}.*allgather,mpi-best\\[[a-z_]+\\],4096,${_w}"
      -P ${_zpp_bench_check})
  set_tests_properties(bench_mpi_peers_corrupt_2x2 PROPERTIES LABELS mpi
    TIMEOUT 60 ENVIRONMENT "ZPP_TOPO=2x2;OMPI_MCA_mpi_yield_when_idle=1;${_fake_env}")
  # An algorithm that hands off to another is not run and says so: at 6
  # ranks recursive doubling hands off to bruck, and no row is named after
  # it.
  zpp_bench_test(bench_mpi_best_handoff_3x2 6 3x2
    "--coll;allgather;--variant;mpi-best;${_peer_args}"
    "-DEXPECT_OUT=# mpi-best size 1024 [^\n]* recursive_doubling \\(hands off to bruck at 6 ranks\\)"
    "-DEXPECT_NOT_OUT=mpi-best\\[recursive_doubling\\]")
  # Requests that cannot be honoured fail by name: HAN on one node (it
  # refuses a communicator whose ranks all share a node: tuned serves the
  # probe), mpi-best when tuned's dynamic rules are switched off (a forced
  # algorithm would be ignored) or a rules file is set (its rules would
  # win over the forced algorithm), and a forced algorithm that does not
  # serve its communicator (tuned below basic: basic's linear allgather
  # serves every one).
  zpp_bench_test(bench_mpi_han_one_node_2x2 4 2x2
    "--coll;allgather;--variant;mpi-han;${_peer_args}"
    -DEXPECT_RC=3
    "-DEXPECT_ERR=variant mpi-han: HAN was not selected: [^\n]* was served by tuned:")
  set(_rules ${CMAKE_CURRENT_BINARY_DIR}/bench_tuned_rules.conf)
  file(WRITE ${_rules} "1\n0\n1\n4\n1\n0 4 0 0\n")
  zpp_bench_test(bench_mpi_best_rules_file_2x2 4 2x2
    "--coll;allgather;--variant;mpi-best;${_peer_args}"
    -DEXPECT_RC=3
    "-DEXPECT_ERR=variant mpi-best: coll_tuned_dynamic_rules_filename is set \\(${_rules}\\)")
  set_tests_properties(bench_mpi_best_rules_file_2x2 PROPERTIES ENVIRONMENT
    "ZPP_TOPO=2x2;OMPI_MCA_mpi_yield_when_idle=1;OMPI_MCA_coll_tuned_dynamic_rules_filename=${_rules}")
  zpp_bench_test(bench_mpi_best_not_served_2x2 4 2x2
    "--coll;allgather;--variant;mpi-best;${_peer_args}"
    -DEXPECT_RC=3
    "-DEXPECT_ERR=variant mpi-best: the communicator forced to tuned:bruck was served by tuned:linear.*setup of allgather mpi-best, size 1024 \\(count [0-9]+\\): [^\n]*: \\(the message above says why\\)")
  set_tests_properties(bench_mpi_best_not_served_2x2 PROPERTIES ENVIRONMENT
    "ZPP_TOPO=2x2;OMPI_MCA_mpi_yield_when_idle=1;OMPI_MCA_coll_tuned_priority=5")
  zpp_bench_test(bench_mpi_best_no_dynamic_2x2 4 2x2
    "--coll;reducescatter;--variant;mpi-best;${_peer_args}"
    -DEXPECT_RC=3
    "-DEXPECT_ERR=variant mpi-best: coll_tuned_use_dynamic_rules is false")
  set_tests_properties(bench_mpi_best_no_dynamic_2x2 PROPERTIES ENVIRONMENT
    "ZPP_TOPO=2x2;OMPI_MCA_mpi_yield_when_idle=1;OMPI_MCA_coll_tuned_use_dynamic_rules=0")
  # Ranks that disagree (half of them with dynamic rules off) all end,
  # each with the failing rank's message, instead of some waiting in a
  # collective the others never enter.
  string(REPLACE ";" "|" _args
    "--coll;reducescatter;--variant;mpi-best;${_peer_args}")
  add_test(NAME bench_mpi_best_disagree_2x2
    COMMAND ${CMAKE_COMMAND} "-DMPIEXEC=${_mpi}" -DNP=4
      -DBENCH=$<TARGET_FILE:zpp-bench> "-DARGS=${_args}"
      -DENV=OMPI_MCA_coll_tuned_use_dynamic_rules=0 -DEXPECT_RC=3
      "-DEXPECT_ERR=variant mpi-best: coll_tuned_use_dynamic_rules is false"
      -DBOUND=12 -P ${CMAKE_CURRENT_SOURCE_DIR}/bench/check_agree.cmake)
  set_tests_properties(bench_mpi_best_disagree_2x2 PROPERTIES LABELS mpi
    TIMEOUT 40 ENVIRONMENT "ZPP_TOPO=2x2;OMPI_MCA_mpi_yield_when_idle=1")

  # Emulated build (ZPP_CUDA_EMU): every collective on device memory, with
  # the MPI backend (staging) and, when the NCCL stand-in is in the tree,
  # the NCCL backend.  The same checks as on host memory.  Label "emu".
  if(ZPP_CUDA_EMU)
    set(_backends mpi)
    if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/nccl_emu/nccl_emu.c AND ZPP_WITH_NCCL_ENABLED)
      list(APPEND _backends nccl)
    endif()
    foreach(_be ${_backends})
      foreach(_coll allgather reducescatter hpz-gather)
        set(_name bench_device_${_be}_${_coll}_2x2)
        # with NCCL, bf16-hier too: its communicator of its own on NCCL
        set(_var "")
        set(_want "")
        if(_be STREQUAL "nccl" AND _coll STREQUAL "allgather")
          set(_var "--variant;bf16,qwz8,qwz4,bf16-hier;")
        elseif(_be STREQUAL "nccl" AND _coll STREQUAL "reducescatter")
          set(_var "--variant;bf16,qgz4,qgz8,qgz8-4,bf16-hier;")
        endif()
        if(_var)
          set(_want "-DEXPECT_VARIANTS=bf16|bf16-hier")
        endif()
        zpp_bench_test(${_name} 4 2x2
          "--coll;${_coll};--memory;device;--backend;${_be};${_var}-b;1K;-e;16K;-f;4;-n;1;-w;1;-c;1;--format;csv"
          ${_want})
        set(_env "ZPP_TOPO=2x2;OMPI_MCA_mpi_yield_when_idle=1")
        if(_be STREQUAL "nccl")
          string(APPEND _env ";ZPP_NCCL_LIBRARY=$<TARGET_FILE:zpp_nccl_emu>")
        endif()
        set_tests_properties(${_name} PROPERTIES LABELS emu TIMEOUT 180
          ENVIRONMENT "${_env}")
      endforeach()
    endforeach()
  endif()

  if(NOT ZPP_HAVE_CUDA_RT)
    zpp_bench_test(bench_device_no_cuda 1 1x1 "--memory;device"
      -DEXPECT_RC=3 "-DEXPECT_ERR=no CUDA device")
  endif()
endif()

# zpp-quant-bench --cold (label "unit", about 10 s): inputs read from
# memory, where the encoders prefetch; every row bytewise against the
# scalar path, odd lengths and block sizes (tests/quant_bench_test.sh).
if(TARGET zpp-quant-bench)
  add_test(NAME quant_bench_cold
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/quant_bench_test.sh
      $<TARGET_FILE:zpp-quant-bench>)
  set_tests_properties(quant_bench_cold PROPERTIES LABELS unit TIMEOUT 120)
endif()

# perf/plot_cluster_study.py's tables from a made-up study: mpi-best as one
# series, the targets against the fastest of bf16 and Open MPI's peers
# (about 1 s).
add_test(NAME plot_cluster_study_script
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/plot_cluster_study_test.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(plot_cluster_study_script PROPERTIES LABELS scripts TIMEOUT 60)
