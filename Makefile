# zpp top-level driver.  The two commands a user needs:
#   make demo   install what is missing, build, run the main job
#   make test   install what is missing, build, run every test
# (both install Debian packages only when run as root; see scripts/install-deps.sh)

BUILD      ?= build
ASAN_BUILD ?= build-asan
EMU_BUILD  ?= build-emu
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=

.PHONY: all deps deps-python configure build asan emu tsan fuzz test test-unit test-asan \
  test-asan-mpi test-tsan test-fuzz test-emu test-cluster test-python test-python-emu test-wheel \
  demo clean help

all: build

help:
	@echo "make demo    - install missing packages, build, run the demo"
	@echo "make test    - install missing packages, build, run all tests (incl. ASan/UBSan"
	@echo "               and the device path on the emulated CUDA runtime)"
	@echo "make test-emu - only the device path on the emulated CUDA runtime ($(EMU_BUILD)/)"
	@echo "make test-cluster - the MPI suites on a real cluster of network namespaces"
	@echo "               (scripts/netns_cluster.sh; needs root, else skipped)"
	@echo "make test-asan / test-asan-mpi / test-tsan / test-fuzz - one sanitizer suite"
	@echo "make test-python - only the Python bindings and FSDP2 tests (pytest, venv $(PY_VENV)/)"
	@echo "make test-slurm - zpp-bench and FSDP2 under srun on a one-node Slurm started here"
	@echo "               (tests/slurm_test.sh; needs root and slurm-wlm, else skipped)"
	@echo "make test-launch - every launch line README.md, docs/ and the examples print, as printed"
	@echo "               (each other code line naming a launcher listed with why it is not run)"
	@echo "make test-python-emu - the bindings on device memory (emulated CUDA runtime)"
	@echo "make test-wheel - pip's wheel of the tree in a fresh venv ($(BUILD)/wheel-venv/):"
	@echo "               python -m zpp, all-gather and FSDP2 under mpirun and torchrun"
	@echo "make build   - configure and build into $(BUILD)/"
	@echo "make clean   - remove build directories"

deps:
	@bash scripts/install-deps.sh

# The Python environment (torch, numpy, cffi, pytest; pinned in
# python/requirements.txt) of the bindings' tests and the FSDP2 demo,
# installed from .wheelhouse/, where the pinned wheels are downloaded once
# (test-wheel's fresh venvs install from there too).
PY_VENV ?= .venv-torch
deps-python:
	@bash scripts/install-deps.sh --python

# Every compile of $(BUILD)/ and of the wheel (make test-wheel) goes
# through tools/ccache_launcher.sh: ccache where it is installed and works,
# else the compiler itself; the build remembers only the script's path.
# The wheel then compiles the library's sources with the flags $(BUILD)/
# compiles them with, and takes them from the cache.  A $(BUILD)/
# configured with another launcher is configured again.
LAUNCHER := $(CURDIR)/tools/ccache_launcher.sh
LAUNCHER_ARGS = -DCMAKE_C_COMPILER_LAUNCHER=$(LAUNCHER) -DCMAKE_CXX_COMPILER_LAUNCHER=$(LAUNCHER) \
  -DCMAKE_CUDA_COMPILER_LAUNCHER=$(LAUNCHER)
ifneq ($(wildcard $(BUILD)/CMakeCache.txt),)
ifeq ($(shell grep -sx 'CMAKE_C_COMPILER_LAUNCHER:[A-Z]*=$(LAUNCHER)' $(BUILD)/CMakeCache.txt),)
.PHONY: $(BUILD)/CMakeCache.txt
endif
endif

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(LAUNCHER_ARGS) $(CMAKE_ARGS)

configure: $(BUILD)/CMakeCache.txt

build: deps configure
	cmake --build $(BUILD) -j$(JOBS)

# AddressSanitizer + UndefinedBehaviorSanitizer (CPU code; CUDA stays out).
# MPI is in: the unit suites and a few multi-rank suites run sanitized
# (test-asan-mpi).
asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DZPP_SANITIZE=ON \
	  -DZPP_WITH_CUDA=OFF -DZPP_WITH_MPI=AUTO -DZPP_WITH_NCCL=OFF -DZPP_BUILD_TOOLS=ON
	cmake --build $(ASAN_BUILD) -j$(JOBS)

# ThreadSanitizer on the threading code: the engine thread, requests,
# the transports' locks, the parameter groups' in-flight checks
# (tests/sanitizers/README.md).
TSAN_TARGETS = test_engine test_transport test_runtime_train test_runtime

tsan: deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DZPP_SANITIZE=thread \
	  -DZPP_WITH_CUDA=OFF -DZPP_WITH_MPI=AUTO -DZPP_WITH_NCCL=OFF -DZPP_BUILD_TOOLS=ON
	cmake --build $(TSAN_BUILD) -j$(JOBS) --target $(TSAN_TARGETS)

# libFuzzer targets (tests/fuzz), built with clang; skipped, saying why,
# where clang is missing.
fuzz: deps
	@if ! command -v clang > /dev/null; then \
	  echo "make fuzz: skipped: clang is not installed (scripts/install-deps.sh installs it as root)"; \
	else \
	  CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Debug -DZPP_FUZZ=ON \
	    -DZPP_WITH_CUDA=OFF -DZPP_WITH_MPI=OFF -DZPP_WITH_NCCL=OFF -DZPP_BUILD_TESTS=OFF \
	    -DZPP_BUILD_TOOLS=OFF && \
	  cmake --build $(FUZZ_BUILD) -j$(JOBS); \
	fi

# The device path (kernels, device memory, streams, NCCL) built against the
# CPU emulator of the CUDA runtime (tests/cuda_emu): no GPU needed.  Only
# the targets of the tests labelled "emu" are built.
EMU_TARGETS = zpp zpp_cudart_emu zpp_nccl_emu test_cuda_emu test_quant_cuda test_elementwise_cuda \
  test_coll test_coll_align test_transport \
  test_runtime test_device_path test_nccl_transport test_qgz_device test_build_features zpp-bench \
  test_isum_cuda test_qgz_int

emu: deps
	cmake -S . -B $(EMU_BUILD) -DCMAKE_BUILD_TYPE=Release -DZPP_CUDA_EMU=ON \
	  -DZPP_WITH_CUDA=OFF $(CMAKE_ARGS)
	cmake --build $(EMU_BUILD) -j$(JOBS) --target $(EMU_TARGETS)

test-emu: emu
	cd $(EMU_BUILD) && ctest --output-on-failure -L emu

# Single-process tests two at a time; those with several ranks or a
# bootstrap port run alone (RUN_SERIAL, set at the end of tests/CMakeLists.txt).
test-unit: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

# The sanitizers' settings of both ASan targets (see test-asan-mpi: some
# unit tests also start programs under mpirun).  intercept_tls_get_addr=0:
# gcc 12's runtime misreads dynamic TLS blocks (Open MPI's and UCX's
# plugins have some) and LeakSanitizer's tracer then crashes at exit
# (tests/test_sanitizer_env.cc, tests/sanitizers/README.md).
ASAN_ENV = OMPI_MCA_mca_base_component_disable_dlclose=1 \
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:detect_odr_violation=0:fast_unwind_on_malloc=0:intercept_tls_get_addr=0 \
  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitizers/lsan.supp:print_suppressions=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

# The unit suites under ASan + UBSan, less ASAN_UNIT_SKIP (all of them
# run in test-unit): the layer checks (shell scripts over the sources,
# nothing for the sanitizers to see) and, to keep the run short, part of
# the fault scenarios of Shrink.* and Recover.* (forked jobs of 4 or 8
# ranks, up to 30 s each).  Kept here: Shrink: a shrink during the
# collectives (2x2), a second death after the decision (the failed
# commit's cleanup), a coordinator killed mid-decision, a shrink without a
# failure, a forked child that does not keep the listener, the listener on
# ZPP_BOOTSTRAP_ADDR and the argument checks; Recover: a recovery with qwZ
# (2x2), a whole node lost (2x4), a lost rank owning only padding (the
# shard boundary arithmetic), hpZ off and the copy holders dead (data
# lost), survivors at different generations (MISMATCH), the state in
# several chunks, the own full buffer of a failed fetch and the argument
# checks.  The skipped cases are not all repeats: a dead bootstrap root, a
# replaced coordinator, a rank left out, stale copies and two groups are
# paths of their own, seen only in test-unit.  ASAN_UNIT_SKIP= runs every
# unit test.
ASAN_UNIT_SKIP ?= ^(layers_check|layers_check_refuses)$$|^Shrink[.](KillBeforeAllGather1x4|KillDuringCollectives1x4|KillRank0BeforeAllGather2x2|KillDuringCollectives2x4|KillBeforeAllGather2x4|LiveRankThatDoesNotJoinIsExcluded|CoordinatorKilledBeforeDecidingIsReplaced|FailedConnectIsNoProofOfDeath|UnreachableCoordinatorLeavesTheRankOut)$$|^Recover[.](Kill1Exact2x2|Kill5Exact2x4|Kill0Quantized2x4|OneNodeIsDataLost1x4|UnevenNodesAreDataLost|StaleCopyIsDataLost2x2|TwoGroupsInCreationOrder2x2|TwoGroupsPairedInDifferentOrdersMismatch2x2)$$
test-asan: asan
	cd $(ASAN_BUILD) && $(ASAN_ENV) ctest --output-on-failure -L unit \
	  $(if $(ASAN_UNIT_SKIP),-E '$(ASAN_UNIT_SKIP)')

# The multi-rank suites under ASan + UBSan, every rank sanitized, leaks
# checked.  Open MPI's own leaks are suppressed by module
# (tests/sanitizers/lsan.supp); for that the stacks must name the modules:
# Open MPI keeps its plugins loaded (disable_dlclose) and malloc stacks are
# unwound fully (fast_unwind_on_malloc=0; Open MPI has no frame pointers).
# A subset that covers every collective, the engine, the transport and
# the parameter groups (a residual freed under a started reduction) on
# 2x2 keeps this short; ASAN_MPI_TESTS=. runs every "mpi" suite (long;
# there faults_* fail on the MPI objects zpp leaks on purpose once a
# communicator is aborted, and soak_* on RSS growth, ASan's quarantine).
ASAN_MPI_TESTS ?= ^(engine_2x2|coll_2x2|transport_mpi_2x2|runtime_2x2)$$
test-asan-mpi: asan
	cd $(ASAN_BUILD) && $(ASAN_ENV) \
	  ctest --output-on-failure --no-tests=error -L mpi -R '$(ASAN_MPI_TESTS)'

# UCX_MEM_EVENTS=no: UCX's memory hooks (libucm, loaded with Open MPI's
# UCX support or zpp's UCX backend) call into TSan from exiting threads,
# which crashes the TSan runtime at exit.
test-tsan: tsan
	cd $(TSAN_BUILD) && UCX_MEM_EVENTS=no \
	  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/sanitizers/tsan.supp" \
	  ctest --output-on-failure --no-tests=error -R '^(engine_2x2|transport_mpi_2x2|runtime_train_math|runtime_2x2)$$'

test-fuzz: fuzz
	@if [ -d $(FUZZ_BUILD)/tests/fuzz ]; then \
	  cd $(FUZZ_BUILD) && ctest --output-on-failure --no-tests=error -L fuzz -j2; \
	else \
	  echo "make test-fuzz: skipped: no fuzz build (clang missing, see above)"; \
	fi

# The transport and collective suites and the shrink and recovery faults
# (tests/shrink_cluster_worker.c) on a real cluster on this machine:
# network namespaces as nodes, shaped veth links, topology discovered
# (tests/cluster_tests.sh; about 4-5 minutes on this shared machine, its
# header has the measured times).  Skipped, saying why, where namespaces
# cannot be made (not root, no iproute2).
test-cluster: build
	@bash tests/cluster_tests.sh $(BUILD)

# python/ (zpp bindings, zpp.fsdp) against the library of $(BUILD)/:
# single-process tests, then mpirun and torchrun launches (about 1.5 min of
# CPU in all).
test-python: build deps-python
	ZPP_LIBRARY=$(abspath $(BUILD))/libzpp.so ZPP_BUILD_DIR=$(abspath $(BUILD)) \
	  $(PY_VENV)/bin/python -m pytest -q python/tests

# zpp under a real Slurm: munged, slurmctld and slurmd of its own on this
# machine (one node), then srun -n 4 zpp-bench (the TCP bootstrap from
# srun's variables), the FSDP2 example and the srun lines the docs print;
# every daemon stopped on exit (tests/slurm_test.sh, about 40-70 s); the
# Python runs use zpp as test-wheel's venv has it from `pip install .`.
# Skipped, saying why, when not root or slurm-wlm / munge are missing.
.PHONY: test-slurm test-launch
test-slurm: build test-wheel
	@bash tests/slurm_test.sh $(BUILD) $(BUILD)/wheel-venv

# Every launch line (mpirun, torchrun, srun, ...) of README.md's and
# docs/*.md's code blocks and inline code and of the examples' docstrings,
# run as printed from the root with only environment added
# (tests/launch_lines_test.py; srun's by test-slurm, the namespace
# cluster's listed, not run; about 1-2 min).  Every code line or span that
# names a launcher must be one of them, a mention by rule, or on the test's
# list of lines not run with the reason; it fails otherwise.  The lines
# name build/, so BUILD must be build.  Python is test-wheel's venv: zpp
# as `pip install .` installs it, no PYTHONPATH or ZPP_LIBRARY.
test-launch: build test-wheel
	$(PY_VENV)/bin/python tests/launch_lines_test.py --venv $(BUILD)/wheel-venv

# The bindings on device memory (python/tests/test_device_emu.py): zpp.Comm
# with memory="device" on __cuda_array_interface__ arrays, against the
# library of $(EMU_BUILD)/ (emulated CUDA runtime, NCCL stand-in); about
# 10 s.
test-python-emu: emu deps-python
	ZPP_LIBRARY=$(abspath $(EMU_BUILD))/libzpp.so ZPP_BUILD_DIR=$(abspath $(EMU_BUILD)) \
	  $(PY_VENV)/bin/python -m pytest -q python/tests/test_device_emu.py

# The wheel as a user installs it (`pip install .`, pyproject.toml): built
# from this tree (CMake build directory $(BUILD)/wheel-build, kept, so a
# rebuild is incremental), installed into a fresh venv $(BUILD)/wheel-venv
# with the pinned requirements (from .wheelhouse/, which deps-python
# downloads once), then run with no ZPP_LIBRARY or PYTHONPATH, outside the
# tree: python -m zpp, a 2-rank all-gather and 2 FSDP2 steps under mpirun
# and torchrun (tests/wheel/run.sh).  After `build`, so that with ccache
# the wheel's first build takes $(BUILD)/'s objects from the cache instead
# of compiling them again (nvcc's kernels are most of a CUDA build's
# time); without ccache that first build compiles everything once more.
# run.sh prints the time of each step and the cache's hits.
test-wheel: build deps-python
	@bash tests/wheel/run.sh $(PY_VENV)/bin/python $(BUILD) $(JOBS)

test: test-unit test-asan test-asan-mpi test-tsan test-fuzz test-emu test-cluster test-python \
  test-python-emu test-wheel test-slurm test-launch
	@echo "make test: all suites passed (build: $(BUILD), sanitizers: $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD), emulated GPU: $(EMU_BUILD), namespace cluster, Python/FSDP2, wheel, Slurm unless test-slurm said SKIPPED above, launch lines)"

# The demo needs only the tools and benchmarks, not the test suites.
DEMO_TARGETS = zpp-topo zpp-bench zpp-train zpp-quant-error zpp-quant-bench

demo: deps deps-python configure
	cmake --build $(BUILD) -j$(JOBS) --target $(DEMO_TARGETS) zpp
	@bash scripts/demo.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(EMU_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)
