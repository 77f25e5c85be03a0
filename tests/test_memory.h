// The memory space of a multi-rank suite's buffers: host memory, or with
// ZPP_TEST_MEMORY=device, CUDA device memory (a GPU, or the emulated
// runtime of an emulated build: tests/cuda_emu).  A test keeps its data in
// host vectors and passes the collectives Mem's pointers, which are the
// vectors themselves on host memory and device copies of them on device
// memory; Mem::back() copies the outputs back.  So one test body checks
// both memory spaces against the same references and bounds.
//
// ZPP_TEST_BACKEND=mpi|nccl|auto picks the backend of the suite's
// communicator (default auto).
#ifndef ZPP_TESTS_TEST_MEMORY_H
#define ZPP_TESTS_TEST_MEMORY_H

#include <mpi.h>
#include <zpp/zpp_comm.h>

#ifndef ZPP_HAVE_CUDA
#define ZPP_HAVE_CUDA 0
#endif
#if ZPP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace zpp_test {

inline bool DeviceMemory() {
  const char *m = std::getenv("ZPP_TEST_MEMORY");
  return m != nullptr && std::string(m) == "device";
}

// Fills the memory space and backend of a communicator config from
// ZPP_TEST_MEMORY and ZPP_TEST_BACKEND.  Exits the job when device memory
// is asked for and zpp has no CUDA: a test must not pass by running on
// host memory instead.
inline void ApplyMemoryConfig(zpp_comm_config_t *cfg) {
  const char *b = std::getenv("ZPP_TEST_BACKEND");
  std::string be = b ? b : "auto";
  cfg->backend = be == "mpi" ? ZPP_BACKEND_MPI : be == "nccl" ? ZPP_BACKEND_NCCL
                                                               : ZPP_BACKEND_AUTO;
  if (!DeviceMemory()) return;
#if ZPP_HAVE_CUDA
  cfg->memory = ZPP_MEMORY_DEVICE;
#else
  std::fprintf(stderr, "ZPP_TEST_MEMORY=device: this build has no CUDA\n");
  MPI_Abort(MPI_COMM_WORLD, 2);
#endif
}

// Makes the suite's device current on the calling thread: the rank's local
// rank on its machine modulo the number of devices, the documented default
// of zpp_comm_config_t.cuda_device -1, computed here independently of
// zpp.  Returns the device, -1 on host memory.
inline int UseSuiteDevice() {
  if (!DeviceMemory()) return -1;
#if ZPP_HAVE_CUDA
  MPI_Comm local;
  int lr = 0, n = 0;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &lr);
  MPI_Comm_free(&local);
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0 || cudaSetDevice(lr % n) != cudaSuccess) {
    std::fprintf(stderr, "ZPP_TEST_MEMORY=device: no usable CUDA device\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return lr % n;
#else
  return -1;
#endif
}

// The buffers of one call (or of a few started calls) in the suite's
// memory space; device copies are freed when Mem goes out of scope.
class Mem {
 public:
  Mem() = default;
  Mem(const Mem &) = delete;
  Mem &operator=(const Mem &) = delete;
  ~Mem() {
#if ZPP_HAVE_CUDA
    for (auto &b : bufs_)
      if (b.dev) cudaFree(b.dev);
#endif
  }

  // An input: the vector's bytes in the suite's memory space.
  template <class T>
  T *in(const std::vector<T> &v) {
    return static_cast<T *>(add(const_cast<T *>(v.data()), v.size() * sizeof(T), false));
  }
  // An output (or input and output): the same, and back() copies it back.
  template <class T>
  T *out(std::vector<T> &v) {
    return static_cast<T *>(add(v.data(), v.size() * sizeof(T), true));
  }
  template <class T, size_t N>
  T *out(T (&a)[N]) {
    return static_cast<T *>(add(a, sizeof a, true));
  }

  // Copies the outputs back into their vectors (blocking).
  void back() {
#if ZPP_HAVE_CUDA
    for (auto &b : bufs_)
      if (b.dev && b.is_out) check(cudaMemcpy(b.host, b.dev, b.bytes, cudaMemcpyDeviceToHost),
                                   "cudaMemcpy to host");
#endif
  }

 private:
  struct Buf {
    void *host, *dev;
    size_t bytes;
    bool is_out;
  };
  std::vector<Buf> bufs_;

  static void check(int e, const char *what) {
#if ZPP_HAVE_CUDA
    if (e != 0) {
      std::fprintf(stderr, "test memory: %s: %s\n", what,
                   cudaGetErrorString((cudaError_t)e));
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
#else
    (void)e;
    (void)what;
#endif
  }

  // One device copy per host buffer, however often it is passed.
  void *add(void *host, size_t bytes, bool is_out) {
    if (!DeviceMemory() || host == nullptr) return host;
    for (auto &b : bufs_)
      if (b.host == host && b.bytes == bytes) {
        b.is_out = b.is_out || is_out;
        return b.dev;
      }
#if ZPP_HAVE_CUDA
    void *d = nullptr;
    check(cudaMalloc(&d, bytes ? bytes : 1), "cudaMalloc");
    if (bytes) check(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
    bufs_.push_back({host, d, bytes, is_out});
    return d;
#else
    (void)bytes;
    (void)is_out;
    return host;
#endif
  }
};

}  // namespace zpp_test

#endif  // ZPP_TESTS_TEST_MEMORY_H
