# zpp top-level driver.  The two commands a user needs:
#   make demo   install what is missing, build, run the main job
#   make test   install what is missing, build, run every test
# (both install Debian packages only when run as root; see scripts/install-deps.sh)

BUILD      ?= build
ASAN_BUILD ?= build-asan
EMU_BUILD  ?= build-emu
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=

.PHONY: all deps configure build asan emu test test-unit test-asan test-emu test-cluster demo clean help

all: build

help:
	@echo "make demo    - install missing packages, build, run the demo"
	@echo "make test    - install missing packages, build, run all tests (incl. ASan/UBSan"
	@echo "               and the device path on the emulated CUDA runtime)"
	@echo "make test-emu - only the device path on the emulated CUDA runtime ($(EMU_BUILD)/)"
	@echo "make test-cluster - the MPI suites on a real cluster of network namespaces"
	@echo "               (scripts/netns_cluster.sh; needs root, else skipped)"
	@echo "make build   - configure and build into $(BUILD)/"
	@echo "make clean   - remove build directories"

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

configure: $(BUILD)/CMakeCache.txt

build: deps configure
	cmake --build $(BUILD) -j$(JOBS)

# Unit tests under AddressSanitizer + UndefinedBehaviorSanitizer (CPU code
# only: CUDA and MPI stay out of the sanitized build).
asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DZPP_SANITIZE=ON \
	  -DZPP_WITH_CUDA=OFF -DZPP_WITH_MPI=OFF -DZPP_WITH_NCCL=OFF -DZPP_BUILD_TOOLS=OFF
	cmake --build $(ASAN_BUILD) -j$(JOBS)

# The device path (kernels, device memory, streams, NCCL) built against the
# CPU emulator of the CUDA runtime (tests/cuda_emu): no GPU needed.  Only
# the targets of the tests labelled "emu" are built.
EMU_TARGETS = zpp_cudart_emu zpp_nccl_emu test_cuda_emu test_quant_cuda test_coll test_transport \
  test_runtime test_device_path zpp-bench

emu: deps
	cmake -S . -B $(EMU_BUILD) -DCMAKE_BUILD_TYPE=Release -DZPP_CUDA_EMU=ON \
	  -DZPP_WITH_CUDA=OFF $(CMAKE_ARGS)
	cmake --build $(EMU_BUILD) -j$(JOBS) --target $(EMU_TARGETS)

test-emu: emu
	cd $(EMU_BUILD) && ctest --output-on-failure -L emu

test-unit: build
	cd $(BUILD) && ctest --output-on-failure

test-asan: asan
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -L unit

# The transport and collective suites on a real cluster on this machine:
# network namespaces as nodes, shaped veth links, topology discovered
# (tests/cluster_tests.sh; about 1-2 minutes).  Skipped, saying why, where
# namespaces cannot be made (not root, no iproute2).
test-cluster: build
	@bash tests/cluster_tests.sh $(BUILD)

test: test-unit test-asan test-emu test-cluster
	@echo "make test: all suites passed (build: $(BUILD), sanitizers: $(ASAN_BUILD), emulated GPU: $(EMU_BUILD), namespace cluster)"

# The demo needs only the tools and benchmarks, not the test suites.
DEMO_TARGETS = zpp-topo zpp-bench zpp-train zpp-quant-error zpp-quant-bench

demo: deps configure
	cmake --build $(BUILD) -j$(JOBS) --target $(DEMO_TARGETS)
	@bash scripts/demo.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(EMU_BUILD)
