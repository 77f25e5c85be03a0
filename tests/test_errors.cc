// The exact text of the error of every bad argument of every public
// function (include/zpp/*.h), table-driven.  Each row
// calls one function with one bad argument and checks the status and the
// whole message of zpp_get_last_error(), which names the function, the
// argument as the header names it (a field as arg->field), its value where
// there is one, and what it must be.  Functions that take a communicator
// keep the same message as the communicator's last error.  A last test
// reads the headers and fails for any ZPP_API function with no row (or no
// stated reason why no argument can be bad), so a new function needs its
// rows.  Run under mpirun (tests/errors.cmake): every rank makes the same
// calls, as the collective ones need.
#include <gtest/gtest.h>
#include <mpi.h>

#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>
#include <zpp/zpp_mpi.h>
#include <zpp/zpp_runtime.h>

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "mpi_gtest_main.h"

namespace {

zpp_comm_t g_comm = nullptr;
int g_rank = 0, g_size = 1, g_nnodes = 1, g_uniform = 1;

struct Row {
  const char *func;                   // the public function called
  std::function<zpp_status_t()> call; // with one bad argument
  zpp_status_t code;
  std::string text;                   // the whole message
  bool on_comm;                       // also the communicator's last error
};

std::set<std::string> &covered() {
  static std::set<std::string> s;
  return s;
}
int g_rows = 0;  // rows checked so far

void check(const std::vector<Row> &rows) {
  for (const Row &r : rows) {
    covered().insert(r.func);
    g_rows++;
    zpp_status_t st = r.call();
    EXPECT_EQ(st, r.code) << r.func << ": " << zpp_get_last_error();
    if (r.code == ZPP_OK) continue;  // NULL accepted on purpose: no message
    EXPECT_EQ(std::string(zpp_get_last_error()), r.text) << r.func;
    if (r.on_comm) {
      EXPECT_EQ(std::string(zpp_comm_get_last_error(g_comm)), r.text) << r.func;
    }
  }
}

std::string S(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
std::string S(const char *fmt, ...) {
  char b[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  return b;
}

const zpp_status_t NUL = ZPP_ERR_NULL_POINTER, INV = ZPP_ERR_INVALID_ARGUMENT,
                   SMALL = ZPP_ERR_BUFFER_TOO_SMALL, OVF = ZPP_ERR_OVERFLOW;
const char *const kDtypeMust = "must be ZPP_FLOAT32, ZPP_FLOAT16 or ZPP_BFLOAT16";

zpp_quant_config_t q8() {
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  return q;
}

// ---- core and quantizer (zpp.h) -------------------------------------------

TEST(ErrorText, Core) {
  zpp_dtype_t dt;
  const char *v = nullptr;
  check({
      {"zpp_get_version", [] { return zpp_get_version(nullptr); }, NUL,
       "zpp_get_version: version is NULL", false},
      {"zpp_get_build_features", [] { return zpp_get_build_features(nullptr); }, NUL,
       "zpp_get_build_features: features is NULL", false},
      {"zpp_dtype_parse", [&] { return zpp_dtype_parse(nullptr, &dt); }, NUL,
       "zpp_dtype_parse: name is NULL", false},
      {"zpp_dtype_parse", [] { return zpp_dtype_parse("fp32", nullptr); }, NUL,
       "zpp_dtype_parse: dtype is NULL", false},
      {"zpp_dtype_parse", [&] { return zpp_dtype_parse("fp8", &dt); }, INV,
       "zpp_dtype_parse: name \"fp8\": must be fp32, fp16, bf16 or u8", false},
      {"zpp_settings_print", [] { return zpp_settings_print(nullptr); }, NUL,
       "zpp_settings_print: out is NULL", false},
      {"zpp_settings_get", [&] { return zpp_settings_get(nullptr, &v); }, NUL,
       "zpp_settings_get: name is NULL", false},
      {"zpp_settings_get", [] { return zpp_settings_get("ZPP_TIMEOUT_S", nullptr); }, NUL,
       "zpp_settings_get: value is NULL", false},
      {"zpp_settings_get", [&] { return zpp_settings_get("ZPP_NOPE", &v); }, INV,
       "zpp_settings_get: name \"ZPP_NOPE\": not a zpp setting", false},
  });
  // no argument can be bad: any value maps to a text
  EXPECT_STREQ(zpp_status_string((zpp_status_t)-99), "unknown zpp status");
  EXPECT_STREQ(zpp_dtype_name((zpp_dtype_t)9), "unknown");
  EXPECT_EQ(zpp_dtype_size((zpp_dtype_t)9), 0u);
}

TEST(ErrorText, QuantConfig) {
  auto with = [](std::function<void(zpp_quant_config_t *)> f) {
    zpp_quant_config_t q = q8();
    f(&q);
    return q;
  };
  static zpp_quant_config_t b_size, b_bits, b_block, b_mode, b_round;
  b_size = with([](zpp_quant_config_t *q) { q->struct_size = 8; });
  b_bits = with([](zpp_quant_config_t *q) { q->bits = 3; });
  b_block = with([](zpp_quant_config_t *q) { q->block_size = 0; });
  b_mode = with([](zpp_quant_config_t *q) { q->mode = (zpp_quant_mode_t)5; });
  b_round = with([](zpp_quant_config_t *q) { q->rounding = (zpp_rounding_t)4; });
  const std::string ssz = S("cfg->struct_size 8: must be sizeof(zpp_quant_config_t) (%zu); "
                            "initialise with ZPP_QUANT_CONFIG_INIT",
                            sizeof(zpp_quant_config_t));
  std::vector<Row> rows;
  // every function that takes a zpp_quant_config_t reports its fields alike
  struct F {
    const char *name;
    std::function<zpp_status_t(const zpp_quant_config_t *)> call;
  };
  static float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
  static uint8_t enc[64];
  size_t bytes = 0;
  const F fs[] = {
      {"zpp_quant_config_check", [](const zpp_quant_config_t *q) { return zpp_quant_config_check(q); }},
      {"zpp_quant_encoded_size",
       [&](const zpp_quant_config_t *q) { return zpp_quant_encoded_size(q, 8, &bytes); }},
      {"zpp_quant_encode",
       [](const zpp_quant_config_t *q) { return zpp_quant_encode(q, ZPP_FLOAT32, x, 8, enc, 64); }},
      {"zpp_quant_decode",
       [](const zpp_quant_config_t *q) { return zpp_quant_decode(q, enc, 64, 8, ZPP_FLOAT32, y); }},
      {"zpp_quant_decode_accumulate",
       [](const zpp_quant_config_t *q) { return zpp_quant_decode_accumulate(q, enc, 64, 8, y); }},
      {"zpp_quant_encode_device",
       [](const zpp_quant_config_t *q) {
         return zpp_quant_encode_device(q, ZPP_FLOAT32, x, 8, enc, 64, nullptr);
       }},
      {"zpp_quant_decode_device",
       [](const zpp_quant_config_t *q) {
         return zpp_quant_decode_device(q, enc, 64, 8, ZPP_FLOAT32, y, nullptr);
       }},
      {"zpp_quant_decode_accumulate_device",
       [](const zpp_quant_config_t *q) {
         return zpp_quant_decode_accumulate_device(q, enc, 64, 8, y, nullptr);
       }},
  };
  for (const F &f : fs) {
    std::string p = std::string(f.name) + ": ";
    auto call = f.call;
    rows.push_back({f.name, [call] { return call(nullptr); }, NUL, p + "cfg is NULL", false});
    rows.push_back({f.name, [call] { return call(&b_size); }, INV, p + ssz, false});
    rows.push_back({f.name, [call] { return call(&b_bits); }, INV, p + "cfg->bits 3: must be 8 or 4",
                    false});
    rows.push_back({f.name, [call] { return call(&b_block); }, INV,
                    p + "cfg->block_size 0: must be >= 1", false});
    rows.push_back({f.name, [call] { return call(&b_mode); }, INV,
                    p + "cfg->mode 5: must be ZPP_QUANT_SYMMETRIC (0) or ZPP_QUANT_ASYMMETRIC (1)",
                    false});
    rows.push_back({f.name, [call] { return call(&b_round); }, INV,
                    p + "cfg->rounding 4: must be ZPP_ROUND_NEAREST (0) or ZPP_ROUND_STOCHASTIC (1)",
                    false});
  }
  check(rows);
}

TEST(ErrorText, QuantBuffers) {
  static const zpp_quant_config_t q = q8();  // INT8, block 256: 8 elements need 12 bytes
  static float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
  static uint8_t enc[64];
  const size_t huge = SIZE_MAX / 2;
  check({
      {"zpp_quant_encoded_size", [] { return zpp_quant_encoded_size(&q, 8, nullptr); }, NUL,
       "zpp_quant_encoded_size: bytes is NULL", false},
      {"zpp_quant_encoded_size",
       [&] {
         size_t b;
         zpp_quant_config_t q4 = q8();
         q4.block_size = 1;  // 4 bytes of scale per element
         return zpp_quant_encoded_size(&q4, huge, &b);
       },
       OVF, S("zpp_quant_encoded_size: count %zu: encoded size overflows size_t", huge), false},
      // encode
      {"zpp_quant_encode", [] { return zpp_quant_encode(&q, (zpp_dtype_t)7, x, 8, enc, 64); }, INV,
       std::string("zpp_quant_encode: dtype 7: ") + kDtypeMust, false},
      {"zpp_quant_encode", [&] { return zpp_quant_encode(&q, ZPP_FLOAT32, x, huge, enc, 64); }, OVF,
       S("zpp_quant_encode: count %zu: input bytes overflow size_t", huge), false},
      {"zpp_quant_encode", [] { return zpp_quant_encode(&q, ZPP_FLOAT32, nullptr, 8, enc, 64); },
       NUL, "zpp_quant_encode: src is NULL (count 8)", false},
      {"zpp_quant_encode", [] { return zpp_quant_encode(&q, ZPP_FLOAT32, x, 8, nullptr, 64); },
       NUL, "zpp_quant_encode: dst is NULL (count 8)", false},
      {"zpp_quant_encode", [] { return zpp_quant_encode(&q, ZPP_FLOAT32, x, 8, enc, 11); }, SMALL,
       "zpp_quant_encode: dst_bytes 11: 8 elements need 12 bytes", false},
      // decode
      {"zpp_quant_decode", [] { return zpp_quant_decode(&q, enc, 64, 8, (zpp_dtype_t)7, y); }, INV,
       std::string("zpp_quant_decode: dtype 7: ") + kDtypeMust, false},
      {"zpp_quant_decode", [] { return zpp_quant_decode(&q, nullptr, 64, 8, ZPP_FLOAT32, y); },
       NUL, "zpp_quant_decode: src is NULL (count 8)", false},
      {"zpp_quant_decode", [] { return zpp_quant_decode(&q, enc, 64, 8, ZPP_FLOAT32, nullptr); },
       NUL, "zpp_quant_decode: dst is NULL (count 8)", false},
      {"zpp_quant_decode", [] { return zpp_quant_decode(&q, enc, 11, 8, ZPP_FLOAT32, y); }, SMALL,
       "zpp_quant_decode: src_bytes 11: 8 elements need 12 bytes", false},
      {"zpp_quant_decode", [&] { return zpp_quant_decode(&q, enc, 64, huge, ZPP_FLOAT32, y); },
       OVF, S("zpp_quant_decode: count %zu: output bytes overflow size_t", huge), false},
      // decode-accumulate
      {"zpp_quant_decode_accumulate",
       [] { return zpp_quant_decode_accumulate(&q, nullptr, 64, 8, y); }, NUL,
       "zpp_quant_decode_accumulate: src is NULL (count 8)", false},
      {"zpp_quant_decode_accumulate",
       [] { return zpp_quant_decode_accumulate(&q, enc, 64, 8, nullptr); }, NUL,
       "zpp_quant_decode_accumulate: acc is NULL (count 8)", false},
      {"zpp_quant_decode_accumulate", [] { return zpp_quant_decode_accumulate(&q, enc, 11, 8, y); },
       SMALL, "zpp_quant_decode_accumulate: src_bytes 11: 8 elements need 12 bytes", false},
      {"zpp_quant_decode_accumulate",
       [&] { return zpp_quant_decode_accumulate(&q, enc, 64, huge, y); }, OVF,
       S("zpp_quant_decode_accumulate: count %zu: output bytes overflow size_t", huge), false},
      // the device versions check their arguments the same way first
      {"zpp_quant_encode_device",
       [] { return zpp_quant_encode_device(&q, ZPP_FLOAT32, nullptr, 8, enc, 64, nullptr); }, NUL,
       "zpp_quant_encode_device: src is NULL (count 8)", false},
      {"zpp_quant_encode_device",
       [] { return zpp_quant_encode_device(&q, ZPP_FLOAT32, x, 8, enc, 11, nullptr); }, SMALL,
       "zpp_quant_encode_device: dst_bytes 11: 8 elements need 12 bytes", false},
      {"zpp_quant_decode_device",
       [] { return zpp_quant_decode_device(&q, enc, 64, 8, (zpp_dtype_t)7, y, nullptr); }, INV,
       std::string("zpp_quant_decode_device: dtype 7: ") + kDtypeMust, false},
      {"zpp_quant_decode_device",
       [] { return zpp_quant_decode_device(&q, enc, 64, 8, ZPP_FLOAT32, nullptr, nullptr); }, NUL,
       "zpp_quant_decode_device: dst is NULL (count 8)", false},
      {"zpp_quant_decode_accumulate_device",
       [] { return zpp_quant_decode_accumulate_device(&q, enc, 64, 8, nullptr, nullptr); }, NUL,
       "zpp_quant_decode_accumulate_device: acc is NULL (count 8)", false},
      {"zpp_quant_decode_accumulate_device",
       [] { return zpp_quant_decode_accumulate_device(&q, enc, 11, 8, y, nullptr); }, SMALL,
       "zpp_quant_decode_accumulate_device: src_bytes 11: 8 elements need 12 bytes", false},
      // the Hadamard rotation
      {"zpp_hadamard", [] { return zpp_hadamard(3, ZPP_FLOAT32, x, 8, y); }, INV,
       "zpp_hadamard: group 3: must be a power of two >= 2", false},
      {"zpp_hadamard", [] { return zpp_hadamard(8, (zpp_dtype_t)9, x, 8, y); }, INV,
       std::string("zpp_hadamard: dtype 9: ") + kDtypeMust, false},
      {"zpp_hadamard", [&] { return zpp_hadamard(8, ZPP_FLOAT32, x, huge, y); }, OVF,
       S("zpp_hadamard: count %zu: output bytes overflow size_t", huge), false},
      {"zpp_hadamard", [] { return zpp_hadamard(8, ZPP_FLOAT32, nullptr, 8, y); }, NUL,
       "zpp_hadamard: src is NULL (count 8)", false},
      {"zpp_hadamard", [] { return zpp_hadamard(8, ZPP_FLOAT32, x, 8, nullptr); }, NUL,
       "zpp_hadamard: dst is NULL (count 8)", false},
      {"zpp_hadamard", [] { return zpp_hadamard(8, ZPP_BFLOAT16, x, 8, x + 1); }, INV,
       "zpp_hadamard: dst overlaps src (dtype bf16, count 8): only ZPP_FLOAT32 input may share "
       "memory with dst", false},
  });
}

// ---- communicator (zpp_comm.h, zpp_mpi.h) -----------------------------------

zpp_status_t dummy_allgather(void *, const void *, size_t, void *, double) { return ZPP_OK; }
zpp_status_t dummy_bcast(void *, void *, size_t, int, double) { return ZPP_OK; }
zpp_status_t dummy_barrier(void *, double) { return ZPP_OK; }

TEST(ErrorText, CommConfigAndCreation) {
  auto cfg_with = [](std::function<void(zpp_comm_config_t *)> f) {
    zpp_comm_config_t c = ZPP_COMM_CONFIG_INIT;
    f(&c);
    return c;
  };
  static zpp_comm_config_t c_size, c_backend, c_mem, c_dev, c_nccl, c_topo;
  static std::string longtopo(200, '1');
  c_size = cfg_with([](zpp_comm_config_t *c) { c->struct_size = 4; });
  c_backend = cfg_with([](zpp_comm_config_t *c) { c->backend = (zpp_backend_t)9; });
  c_mem = cfg_with([](zpp_comm_config_t *c) { c->memory = (zpp_memory_t)3; });
  c_dev = cfg_with([](zpp_comm_config_t *c) { c->cuda_device = -2; });
  c_nccl = cfg_with([](zpp_comm_config_t *c) { c->backend = ZPP_BACKEND_NCCL; });
  c_topo = cfg_with([](zpp_comm_config_t *c) { c->topology = longtopo.c_str(); });
  static zpp_bootstrap_t b_size, b_fn, b_rank, b_sz;
  zpp_bootstrap_t ok = ZPP_BOOTSTRAP_INIT;
  ok.size = 2;
  ok.allgather = dummy_allgather;
  ok.bcast = dummy_bcast;
  ok.barrier = dummy_barrier;
  b_size = ok;
  b_size.struct_size = 8;
  b_fn = ok;
  b_fn.bcast = nullptr;
  b_rank = ok;
  b_rank.rank = 2;
  b_sz = ok;
  b_sz.size = 0;
  static zpp_comm_t out;
  static zpp_unique_id_t junk;
  std::memset(&junk, 0x5a, sizeof junk);
  check({
      {"zpp_comm_config_check", [] { return zpp_comm_config_check(nullptr); }, NUL,
       "zpp_comm_config_check: cfg is NULL", false},
      {"zpp_comm_config_check", [] { return zpp_comm_config_check(&c_size); }, INV,
       S("zpp_comm_config_check: cfg->struct_size 4: must be sizeof(zpp_comm_config_t) = %zu "
         "(initialise with ZPP_COMM_CONFIG_INIT)", sizeof(zpp_comm_config_t)), false},
      {"zpp_comm_config_check", [] { return zpp_comm_config_check(&c_backend); }, INV,
       "zpp_comm_config_check: cfg->backend 9: must be ZPP_BACKEND_AUTO, _MPI, _NCCL or _UCX",
       false},
      {"zpp_comm_config_check", [] { return zpp_comm_config_check(&c_mem); }, INV,
       "zpp_comm_config_check: cfg->memory 3: must be ZPP_MEMORY_HOST or ZPP_MEMORY_DEVICE",
       false},
      {"zpp_comm_config_check", [] { return zpp_comm_config_check(&c_dev); }, INV,
       "zpp_comm_config_check: cfg->cuda_device -2: must be >= 0, or -1 for automatic", false},
      {"zpp_comm_config_check", [] { return zpp_comm_config_check(&c_nccl); }, INV,
       "zpp_comm_config_check: cfg->backend NCCL needs cfg->memory ZPP_MEMORY_DEVICE", false},
      {"zpp_comm_config_check", [] { return zpp_comm_config_check(&c_topo); }, INV,
       "zpp_comm_config_check: cfg->topology: longer than 127 characters", false},
      // zpp_comm_create: the caller's table, named bs as in the header
      {"zpp_comm_create", [] { return zpp_comm_create(nullptr, nullptr, &out); }, NUL,
       "zpp_comm_create: bs is NULL", false},
      {"zpp_comm_create", [&] { return zpp_comm_create(&ok, nullptr, nullptr); }, NUL,
       "zpp_comm_create: out is NULL", false},
      {"zpp_comm_create", [] { return zpp_comm_create(&b_size, nullptr, &out); }, INV,
       S("zpp_comm_create: bs->struct_size 8: must be sizeof(zpp_bootstrap_t) = %zu "
         "(ZPP_BOOTSTRAP_INIT)", sizeof(zpp_bootstrap_t)), false},
      {"zpp_comm_create", [] { return zpp_comm_create(&b_fn, nullptr, &out); }, NUL,
       "zpp_comm_create: bs->bcast is NULL", false},
      {"zpp_comm_create", [] { return zpp_comm_create(&b_sz, nullptr, &out); }, INV,
       "zpp_comm_create: bs->size 0: must be >= 1", false},
      {"zpp_comm_create", [] { return zpp_comm_create(&b_rank, nullptr, &out); }, INV,
       "zpp_comm_create: bs->rank 2: must be in [0, bs->size = 2)", false},
      {"zpp_get_unique_id", [] { return zpp_get_unique_id(nullptr); }, NUL,
       "zpp_get_unique_id: id is NULL", false},
      {"zpp_release_unique_id", [] { return zpp_release_unique_id(nullptr); }, NUL,
       "zpp_release_unique_id: id is NULL", false},
      {"zpp_comm_create_from_id",
       [] { return zpp_comm_create_from_id(nullptr, 2, 0, nullptr, &out); }, NUL,
       "zpp_comm_create_from_id: id is NULL", false},
      {"zpp_comm_create_from_id",
       [] { return zpp_comm_create_from_id(&junk, 2, 0, nullptr, nullptr); }, NUL,
       "zpp_comm_create_from_id: out is NULL", false},
      {"zpp_comm_create_from_id", [] { return zpp_comm_create_from_id(&junk, 0, 0, nullptr, &out); },
       INV, "zpp_comm_create_from_id: nranks 0: must be >= 1", false},
      {"zpp_comm_create_from_id", [] { return zpp_comm_create_from_id(&junk, 2, 0, nullptr, &out); },
       INV,
       "zpp_comm_create_from_id: id: malformed (no zpp bootstrap magic; was it made by "
       "zpp_get_unique_id and copied whole?)", false},
      {"zpp_comm_create_from_env", [] { return zpp_comm_create_from_env(nullptr, nullptr); }, NUL,
       "zpp_comm_create_from_env: out is NULL", false},
      {"zpp_comm_create_mpi", [] { return zpp_comm_create_mpi(MPI_COMM_WORLD, nullptr, nullptr); },
       NUL, "zpp_comm_create_mpi: out is NULL", false},
      {"zpp_comm_create_mpi", [] { return zpp_comm_create_mpi(MPI_COMM_NULL, nullptr, &out); },
       INV, "zpp_comm_create_mpi: comm is MPI_COMM_NULL", false},
      {"zpp_comm_create_mpi", [] { return zpp_comm_create_mpi(MPI_COMM_WORLD, &c_mem, &out); },
       INV,
       "zpp_comm_create_mpi: cfg->memory 3: must be ZPP_MEMORY_HOST or ZPP_MEMORY_DEVICE",
       false},
  });
  // zpp_comm_create_from_env names the variable that is missing or bad
  const char *saved[2] = {std::getenv("RANK"), std::getenv("WORLD_SIZE")};
  std::string keep[2] = {saved[0] ? saved[0] : "", saved[1] ? saved[1] : ""};
  unsetenv("RANK");
  setenv("WORLD_SIZE", "2", 1);
  check({{"zpp_comm_create_from_env", [] { return zpp_comm_create_from_env(nullptr, &out); }, INV,
          "zpp_comm_create_from_env: RANK is not set (torchrun sets MASTER_ADDR, MASTER_PORT, "
          "RANK and WORLD_SIZE; srun sets SLURM_PROCID and SLURM_NTASKS)", false}});
  setenv("RANK", "x1", 1);
  check({{"zpp_comm_create_from_env", [] { return zpp_comm_create_from_env(nullptr, &out); }, INV,
          "zpp_comm_create_from_env: RANK \"x1\": must be a non-negative integer", false}});
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "0", 1);
  check({{"zpp_comm_create_from_env", [] { return zpp_comm_create_from_env(nullptr, &out); }, INV,
          "zpp_comm_create_from_env: WORLD_SIZE 0: must be >= 1", false}});
  if (saved[0]) setenv("RANK", keep[0].c_str(), 1); else unsetenv("RANK");
  if (saved[1]) setenv("WORLD_SIZE", keep[1].c_str(), 1); else unsetenv("WORLD_SIZE");
}

TEST(ErrorText, CommQueries) {
  static zpp_comm_stats_t tiny;
  tiny.struct_size = 4;
  static zpp_bootstrap_t bs;
  static int i;
  static zpp_backend_t be;
  static zpp_memory_t mem;
  static zpp_link_t link;
  static MPI_Comm mc;
  static zpp_comm_t nc;
  static const int two[2] = {0, 0};
  const std::string rk = S("must be in [0, %d)", g_size);
  std::vector<Row> rows = {
      {"zpp_comm_get_bootstrap", [] { return zpp_comm_get_bootstrap(nullptr, &bs); }, NUL,
       "zpp_comm_get_bootstrap: comm is NULL", false},
      {"zpp_comm_get_bootstrap", [] { return zpp_comm_get_bootstrap(g_comm, nullptr); }, NUL,
       "zpp_comm_get_bootstrap: bs is NULL", false},
      {"zpp_comm_get_mpi_comm", [] { return zpp_comm_get_mpi_comm(nullptr, &mc); }, NUL,
       "zpp_comm_get_mpi_comm: comm is NULL", false},
      {"zpp_comm_get_mpi_comm", [] { return zpp_comm_get_mpi_comm(g_comm, nullptr); }, NUL,
       "zpp_comm_get_mpi_comm: out is NULL", false},
      {"zpp_comm_reset_stats", [] { return zpp_comm_reset_stats(nullptr); }, NUL,
       "zpp_comm_reset_stats: comm is NULL", false},
      {"zpp_comm_abort", [] { return zpp_comm_abort(nullptr); }, NUL,
       "zpp_comm_abort: comm is NULL", false},
      {"zpp_comm_shrink",
       [] {
         zpp_comm_t nc = nullptr;
         return zpp_comm_shrink(nullptr, nullptr, nullptr, &nc);
       },
       NUL, "zpp_comm_shrink: comm is NULL", false},
      {"zpp_comm_get_async_error",
       [] {
         zpp_status_t as;
         return zpp_comm_get_async_error(nullptr, &as);
       },
       NUL, "zpp_comm_get_async_error: comm is NULL", false},
      {"zpp_comm_get_async_error", [] { return zpp_comm_get_async_error(g_comm, nullptr); }, NUL,
       "zpp_comm_get_async_error: status is NULL", false},
      {"zpp_comm_get_stats", [] { return zpp_comm_get_stats(g_comm, &tiny); }, INV,
       "zpp_comm_get_stats: stats->struct_size 4: initialise with ZPP_COMM_STATS_INIT", true},
      {"zpp_comm_node_of", [] { return zpp_comm_node_of(g_comm, -1, &i); }, INV,
       "zpp_comm_node_of: rank -1: " + rk, true},
      {"zpp_comm_local_rank_of", [] { return zpp_comm_local_rank_of(g_comm, g_size, &i); }, INV,
       S("zpp_comm_local_rank_of: rank %d: ", g_size) + rk, true},
      {"zpp_comm_node_size", [] { return zpp_comm_node_size(g_comm, g_nnodes, &i); }, INV,
       S("zpp_comm_node_size: node %d: must be in [0, %d)", g_nnodes, g_nnodes), true},
      {"zpp_comm_link", [] { return zpp_comm_link(g_comm, 7 + g_size, 0, &link); }, INV,
       S("zpp_comm_link: rank %d: ", 7 + g_size) + rk, true},
      {"zpp_comm_link", [] { return zpp_comm_link(g_comm, 0, -3, &link); }, INV,
       "zpp_comm_link: rank -3: " + rk, true},
      {"zpp_comm_split", [] { return zpp_comm_split(nullptr, 0, 0, &nc); }, NUL,
       "zpp_comm_split: comm is NULL", false},
      {"zpp_comm_create_from_ranks", [] { return zpp_comm_create_from_ranks(nullptr, 1, two, &nc); },
       NUL, "zpp_comm_create_from_ranks: comm is NULL", false},
      {"zpp_comm_create_from_ranks",
       [] { return zpp_comm_create_from_ranks(g_comm, 1, nullptr, &nc); }, NUL,
       "zpp_comm_create_from_ranks: ranks is NULL", true},
      {"zpp_comm_create_from_ranks", [] { return zpp_comm_create_from_ranks(g_comm, 0, two, &nc); },
       INV, S("zpp_comm_create_from_ranks: n 0: must be in [1, %d]", g_size), true},
      {"zpp_comm_create_from_ranks",
       [] {
         static const int r[2] = {0, 99};
         return zpp_comm_create_from_ranks(g_comm, 2, r, &nc);
       },
       INV, S("zpp_comm_create_from_ranks: ranks[1] = 99: must be in [0, %d)", g_size), true},
      {"zpp_comm_create_from_ranks", [] { return zpp_comm_create_from_ranks(g_comm, 2, two, &nc); },
       INV, "zpp_comm_create_from_ranks: ranks[0] = ranks[1] = 0: ranks must be distinct", true},
      // collective: every rank passes the same bad argument and fails alike
      {"zpp_comm_split", [] { return zpp_comm_split(g_comm, 0, 0, nullptr); }, NUL,
       "zpp_comm_split: newcomm is NULL", false},
      {"zpp_comm_split", [] { return zpp_comm_split(g_comm, -5, 0, &nc); }, INV,
       "zpp_comm_split: color -5: must be >= 0, or ZPP_SPLIT_NONE", false},
      {"zpp_comm_destroy", [] { return zpp_comm_destroy(nullptr); }, ZPP_OK, "", false},
  };
  // the NULL outputs of the queries
  struct Q {
    const char *name, *arg;
    std::function<zpp_status_t(zpp_comm_t, bool)> call;
  };
  const Q qs[] = {
      {"zpp_comm_rank", "rank", [](zpp_comm_t c, bool n) { return zpp_comm_rank(c, n ? nullptr : &i); }},
      {"zpp_comm_size", "size", [](zpp_comm_t c, bool n) { return zpp_comm_size(c, n ? nullptr : &i); }},
      {"zpp_comm_backend", "backend",
       [](zpp_comm_t c, bool n) { return zpp_comm_backend(c, n ? nullptr : &be); }},
      {"zpp_comm_memory", "memory",
       [](zpp_comm_t c, bool n) { return zpp_comm_memory(c, n ? nullptr : &mem); }},
      {"zpp_comm_algorithm", "algorithm",
       [](zpp_comm_t c, bool n) {
         zpp_algorithm_t al = ZPP_ALGORITHM_DEFAULT;
         return zpp_comm_algorithm(c, n ? nullptr : &al);
       }},
      {"zpp_comm_choose_algorithm", "algorithm",
       [](zpp_comm_t c, bool n) {
         zpp_algorithm_t al = ZPP_ALGORITHM_DEFAULT;
         return zpp_comm_choose_algorithm(c, ZPP_ALGO_COLL_ALLGATHER, 16, ZPP_FLOAT32,
                                          n ? nullptr : &al, nullptr);
       }},
      {"zpp_comm_nnodes", "nnodes", [](zpp_comm_t c, bool n) { return zpp_comm_nnodes(c, n ? nullptr : &i); }},
      {"zpp_comm_node_of", "node", [](zpp_comm_t c, bool n) { return zpp_comm_node_of(c, 0, n ? nullptr : &i); }},
      {"zpp_comm_local_rank_of", "local_rank",
       [](zpp_comm_t c, bool n) { return zpp_comm_local_rank_of(c, 0, n ? nullptr : &i); }},
      {"zpp_comm_node_size", "size",
       [](zpp_comm_t c, bool n) { return zpp_comm_node_size(c, 0, n ? nullptr : &i); }},
      {"zpp_comm_local_rank", "local_rank",
       [](zpp_comm_t c, bool n) { return zpp_comm_local_rank(c, n ? nullptr : &i); }},
      {"zpp_comm_local_size", "local_size",
       [](zpp_comm_t c, bool n) { return zpp_comm_local_size(c, n ? nullptr : &i); }},
      {"zpp_comm_topo_emulated", "emulated",
       [](zpp_comm_t c, bool n) { return zpp_comm_topo_emulated(c, n ? nullptr : &i); }},
      {"zpp_comm_topo_uniform", "uniform",
       [](zpp_comm_t c, bool n) { return zpp_comm_topo_uniform(c, n ? nullptr : &i); }},
      {"zpp_comm_link", "link",
       [](zpp_comm_t c, bool n) { return zpp_comm_link(c, 0, 0, n ? nullptr : &link); }},
      {"zpp_comm_print_topology", "out",
       [](zpp_comm_t c, bool n) { return zpp_comm_print_topology(c, n ? nullptr : stderr, 0); }},
      {"zpp_comm_get_stats", "stats",
       [](zpp_comm_t c, bool n) {
         zpp_comm_stats_t s = ZPP_COMM_STATS_INIT;
         return zpp_comm_get_stats(c, n ? nullptr : &s);
       }},
  };
  for (const Q &q : qs) {
    auto call = q.call;
    rows.push_back({q.name, [call] { return call(nullptr, false); }, NUL,
                    std::string(q.name) + ": comm is NULL", false});
    rows.push_back({q.name, [call] { return call(g_comm, true); }, NUL,
                    std::string(q.name) + ": " + q.arg + " is NULL", true});
  }
  check(rows);
  // no argument can be bad: NULL and unknown values map to a text
  EXPECT_STREQ(zpp_comm_get_last_error(nullptr), "");
  EXPECT_STREQ(zpp_comm_bootstrap_name(nullptr), "");
  EXPECT_STREQ(zpp_link_name((zpp_link_t)42), "unknown");
  EXPECT_STREQ(zpp_group_name((zpp_group_t)42), "unknown");
  EXPECT_STREQ(zpp_backend_name((zpp_backend_t)42), "unknown");
}

// ---- collectives (zpp_coll.h) ----------------------------------------------

TEST(ErrorText, Collectives) {
  static std::vector<float> a(64 * 16), b(64 * 16);
  static const zpp_quant_config_t q = q8();
  static zpp_quant_config_t qbad = q8();
  qbad.bits = 3;
  static zpp_qgz_config_t g = ZPP_QGZ_CONFIG_INIT;
  static int done;
  const std::string dt7 = std::string("dtype 7: ") + kDtypeMust;
  check({
      {"zpp_request_wait", [] { return zpp_request_wait(nullptr); }, ZPP_OK, "", false},
      {"zpp_request_wait_stream", [] { return zpp_request_wait_stream(nullptr, nullptr); },
       ZPP_OK, "", false},
      {"zpp_request_order_stream", [] { return zpp_request_order_stream(nullptr, nullptr); },
       NUL, "zpp_request_order_stream: req is NULL", false},
      {"zpp_request_test", [] { return zpp_request_test(nullptr, &done); }, NUL,
       "zpp_request_test: req is NULL", false},
      // zpp_allgather
      {"zpp_allgather",
       [] { return zpp_allgather(nullptr, a.data(), b.data(), 4, ZPP_FLOAT32, nullptr, nullptr); },
       NUL, "zpp_allgather: comm is NULL", false},
      {"zpp_allgather",
       [] { return zpp_allgather(g_comm, nullptr, b.data(), 4, ZPP_FLOAT32, nullptr, nullptr); },
       NUL, "zpp_allgather: sendbuf is NULL (count 4)", true},
      {"zpp_allgather",
       [] { return zpp_allgather(g_comm, a.data(), nullptr, 4, ZPP_FLOAT32, nullptr, nullptr); },
       NUL, "zpp_allgather: recvbuf is NULL (count 4)", true},
      {"zpp_allgather",
       [] { return zpp_allgather(g_comm, a.data(), b.data(), 4, (zpp_dtype_t)7, nullptr, nullptr); },
       INV, "zpp_allgather: dtype 7: must be ZPP_FLOAT32, ZPP_FLOAT16, ZPP_BFLOAT16 or ZPP_UINT8",
       true},
      // the byte dtype is for the plain all-gather only
      {"zpp_reduce_scatter",
       [] {
         return zpp_reduce_scatter(g_comm, a.data(), b.data(), 4, ZPP_UINT8, ZPP_OP_SUM, nullptr,
                                   nullptr);
       },
       INV,
       "zpp_reduce_scatter: dtype ZPP_UINT8 (u8): bytes are taken by zpp_allgather only; this "
       "call computes on the data and needs ZPP_FLOAT32, ZPP_FLOAT16 or ZPP_BFLOAT16",
       true},
      {"zpp_allgather",
       [] {
         return zpp_allgather(g_comm, a.data(), b.data(), SIZE_MAX / 2, ZPP_FLOAT32, nullptr, nullptr);
       },
       OVF,
       S("zpp_allgather: count %zu: %d ranks x count x 4 bytes overflows size_t", SIZE_MAX / 2,
         g_size),
       true},
      // zpp_reduce_scatter
      {"zpp_reduce_scatter",
       [] {
         return zpp_reduce_scatter(g_comm, nullptr, b.data(), 4, ZPP_FLOAT32, ZPP_OP_SUM, nullptr,
                                   nullptr);
       },
       NUL, "zpp_reduce_scatter: sendbuf is NULL (count 4)", true},
      {"zpp_reduce_scatter",
       [] {
         return zpp_reduce_scatter(g_comm, a.data(), b.data(), 4, ZPP_FLOAT32, (zpp_redop_t)5,
                                   nullptr, nullptr);
       },
       INV, "zpp_reduce_scatter: op 5: must be ZPP_OP_SUM or ZPP_OP_MEAN", true},
      {"zpp_reduce_scatter",
       [] {
         return zpp_reduce_scatter(nullptr, a.data(), b.data(), 4, ZPP_FLOAT32, ZPP_OP_SUM, nullptr,
                                   nullptr);
       },
       NUL, "zpp_reduce_scatter: comm is NULL", false},
      // zpp_qwz_allgather
      {"zpp_qwz_allgather",
       [] { return zpp_qwz_allgather(g_comm, nullptr, a.data(), b.data(), 4, ZPP_FLOAT32, nullptr, nullptr); },
       NUL, "zpp_qwz_allgather: quant is NULL", true},
      {"zpp_qwz_allgather",
       [] { return zpp_qwz_allgather(g_comm, &qbad, a.data(), b.data(), 4, ZPP_FLOAT32, nullptr, nullptr); },
       INV, "zpp_qwz_allgather: quant->bits 3: must be 8 or 4", true},
      {"zpp_qwz_allgather",
       [] { return zpp_qwz_allgather(g_comm, &q, a.data(), nullptr, 4, ZPP_FLOAT32, nullptr, nullptr); },
       NUL, "zpp_qwz_allgather: recvbuf is NULL (count 4)", true},
      {"zpp_qwz_allgather",
       [] { return zpp_qwz_allgather(nullptr, &q, a.data(), b.data(), 4, ZPP_FLOAT32, nullptr, nullptr); },
       NUL, "zpp_qwz_allgather: comm is NULL", false},
      // zpp_qwd_allgather
      {"zpp_qwd_allgather",
       [] { return zpp_qwd_allgather(g_comm, &q, nullptr, b.data(), 4, ZPP_FLOAT32, nullptr, nullptr); },
       NUL, "zpp_qwd_allgather: target is NULL (count 4)", true},
      {"zpp_qwd_allgather",
       [] { return zpp_qwd_allgather(g_comm, &q, a.data(), nullptr, 4, ZPP_FLOAT32, nullptr, nullptr); },
       NUL, "zpp_qwd_allgather: recon is NULL (count 4)", true},
      {"zpp_qwd_allgather",
       [] { return zpp_qwd_allgather(g_comm, &qbad, a.data(), b.data(), 4, ZPP_FLOAT32, nullptr, nullptr); },
       INV, "zpp_qwd_allgather: quant->bits 3: must be 8 or 4", true},
      {"zpp_qwd_allgather",
       [] { return zpp_qwd_allgather(g_comm, &q, a.data(), b.data(), 4, (zpp_dtype_t)7, nullptr, nullptr); },
       INV, "zpp_qwd_allgather: " + dt7, true},
      // zpp_qgz_*
      {"zpp_qgz_residual_count",
       [] {
         size_t rc;
         return zpp_qgz_residual_count(nullptr, 4, &rc);
       },
       NUL, "zpp_qgz_residual_count: comm is NULL", false},
      {"zpp_qgz_residual_count", [] { return zpp_qgz_residual_count(g_comm, 4, nullptr); }, NUL,
       "zpp_qgz_residual_count: residual_count is NULL", false},
      {"zpp_qgz_residual_bytes", [] { return zpp_qgz_residual_bytes(g_comm, &g, 4, nullptr); }, NUL,
       "zpp_qgz_residual_bytes: bytes is NULL", false},
      {"zpp_qgz_residual_bytes",
       [] {
         size_t by;
         return zpp_qgz_residual_bytes(g_comm, nullptr, 4, &by);
       },
       NUL, "zpp_qgz_residual_bytes: cfg is NULL", false},
      {"zpp_qgz_reduce_scatter",
       [] {
         return zpp_qgz_reduce_scatter(g_comm, &g, a.data(), b.data(), 4, ZPP_FLOAT32, (zpp_redop_t)2,
                                       nullptr, nullptr, nullptr);
       },
       INV, "zpp_qgz_reduce_scatter: op 2: must be ZPP_OP_SUM or ZPP_OP_MEAN", true},
      {"zpp_qgz_reduce_scatter",
       [] {
         return zpp_qgz_reduce_scatter(g_comm, &g, a.data(), nullptr, 4, ZPP_FLOAT32, ZPP_OP_SUM,
                                       nullptr, nullptr, nullptr);
       },
       NUL, "zpp_qgz_reduce_scatter: recvbuf is NULL (count 4)", true},
      // the residual's size is checked before the buffers: an overflowing
      // count is named as such, though recvbuf is NULL too
      {"zpp_qgz_reduce_scatter",
       [] {
         return zpp_qgz_reduce_scatter(g_comm, &g, a.data(), nullptr, SIZE_MAX / 2, ZPP_FLOAT32,
                                       ZPP_OP_SUM, nullptr, nullptr, nullptr);
       },
       OVF,
       S("zpp_qgz_reduce_scatter: count %zu: the residual (zpp_qgz_residual_count floats) "
         "overflows size_t",
         SIZE_MAX / 2),
       true},
  });
  // every field of zpp_qgz_config_t, through zpp_qgz_reduce_scatter
  struct G {
    std::function<void(zpp_qgz_config_t *)> set;
    zpp_status_t code;
    std::string text;
  };
  const G gs[] = {
      {[](zpp_qgz_config_t *c) { c->struct_size = 8; }, INV,
       "cfg->struct_size 8: initialise with ZPP_QGZ_CONFIG_INIT"},
      {[](zpp_qgz_config_t *c) { c->intra_bits = 2; }, INV, "cfg->intra_bits 2: must be 4, 8 or 16 (ZPP_QGZ_INTRA_RAW: not quantized inside the node)"},
      {[](zpp_qgz_config_t *c) { c->inter_bits = 16; }, INV, "cfg->inter_bits 16: must be 4 or 8"},
      {[](zpp_qgz_config_t *c) { c->block_size = 0; }, INV, "cfg->block_size 0: must be >= 1"},
      {[](zpp_qgz_config_t *c) { c->mode = (zpp_quant_mode_t)3; }, INV,
       "cfg->mode 3: must be ZPP_QUANT_SYMMETRIC or ZPP_QUANT_ASYMMETRIC"},
      {[](zpp_qgz_config_t *c) { c->hadamard = 48; }, INV,
       "cfg->hadamard 48: must be 0 (off) or a power of two >= 2 that divides block_size 256"},
      {[](zpp_qgz_config_t *c) { c->rounding = (zpp_rounding_t)2; }, INV,
       "cfg->rounding 2: must be ZPP_ROUND_NEAREST or ZPP_ROUND_STOCHASTIC"},
      {[](zpp_qgz_config_t *c) { c->residual_bits = 16; }, INV,
       "cfg->residual_bits 16: must be 32 (fp32) or 8 (INT8)"},
      {[](zpp_qgz_config_t *c) { c->residual_beta = 1.5f; }, INV,
       "cfg->residual_beta 1.5: must be in [0, 1) (0: plain error feedback; LoCo: 0.8)"},
  };
  std::vector<Row> rows;
  for (const G &x : gs) {
    static std::vector<zpp_qgz_config_t> keep;
    keep.push_back(g);
    x.set(&keep.back());
    zpp_qgz_config_t c = keep.back();
    rows.push_back({"zpp_qgz_reduce_scatter",
                    [c] {
                      return zpp_qgz_reduce_scatter(g_comm, &c, a.data(), b.data(), 4, ZPP_FLOAT32,
                                                    ZPP_OP_SUM, nullptr, nullptr, nullptr);
                    },
                    x.code, "zpp_qgz_reduce_scatter: " + x.text, true});
    rows.push_back({"zpp_qgz_residual_bytes",
                    [c] {
                      size_t by;
                      return zpp_qgz_residual_bytes(g_comm, &c, 4, &by);
                    },
                    x.code, "zpp_qgz_residual_bytes: " + x.text, false});
  }
  check(rows);
}

TEST(ErrorText, Hpz) {
  static zpp_hpz_t h = nullptr;
  static zpp_hpz_config_t hc = ZPP_HPZ_CONFIG_INIT, hsz, hq, hbits;
  hsz = hc;
  hsz.struct_size = 8;
  hq = hc;
  hq.quantized = 2;
  hbits = hc;
  hbits.quant.bits = 5;
  static std::vector<float> a(64), b(64 * 16);
  static zpp_hpz_info_t tiny;
  tiny.struct_size = 4;
  check({
      {"zpp_hpz_create", [] { return zpp_hpz_create(nullptr, &hc, 4, ZPP_FLOAT32, &h); }, NUL,
       "zpp_hpz_create: comm is NULL", false},
      {"zpp_hpz_create", [] { return zpp_hpz_create(g_comm, nullptr, 4, ZPP_FLOAT32, &h); }, NUL,
       "zpp_hpz_create: cfg is NULL", true},
      {"zpp_hpz_create", [] { return zpp_hpz_create(g_comm, &hc, 4, ZPP_FLOAT32, nullptr); }, NUL,
       "zpp_hpz_create: hpz is NULL", true},
      {"zpp_hpz_create", [] { return zpp_hpz_create(g_comm, &hsz, 4, ZPP_FLOAT32, &h); }, INV,
       "zpp_hpz_create: cfg->struct_size 8: initialise with ZPP_HPZ_CONFIG_INIT", true},
      {"zpp_hpz_create", [] { return zpp_hpz_create(g_comm, &hq, 4, ZPP_FLOAT32, &h); }, INV,
       "zpp_hpz_create: cfg->quantized 2: must be 0 or 1", true},
      {"zpp_hpz_create", [] { return zpp_hpz_create(g_comm, &hbits, 4, ZPP_FLOAT32, &h); }, INV,
       "zpp_hpz_create: cfg->quant.bits 5: must be 8 or 4", true},
      {"zpp_hpz_create", [] { return zpp_hpz_create(g_comm, &hc, 4, (zpp_dtype_t)7, &h); }, INV,
       std::string("zpp_hpz_create: dtype 7: ") + kDtypeMust, true},
      {"zpp_hpz_destroy", [] { return zpp_hpz_destroy(nullptr); }, ZPP_OK, "", false},
      {"zpp_hpz_invalidate", [] { return zpp_hpz_invalidate(nullptr); }, NUL,
       "zpp_hpz_invalidate: hpz is NULL", false},
      {"zpp_hpz_get_info", [] { return zpp_hpz_get_info(nullptr, &tiny); }, NUL,
       "zpp_hpz_get_info: hpz is NULL", false},
      {"zpp_hpz_forward_gather",
       [] { return zpp_hpz_forward_gather(nullptr, a.data(), b.data(), nullptr, nullptr); }, NUL,
       "zpp_hpz_forward_gather: hpz is NULL", false},
      {"zpp_hpz_backward_gather",
       [] { return zpp_hpz_backward_gather(nullptr, a.data(), b.data(), nullptr, nullptr); }, NUL,
       "zpp_hpz_backward_gather: hpz is NULL", false},
  });
  ASSERT_EQ(zpp_hpz_create(g_comm, &hc, 4, ZPP_FLOAT32, &h), ZPP_OK) << zpp_get_last_error();
  check({
      {"zpp_hpz_get_info", [] { return zpp_hpz_get_info(h, nullptr); }, NUL,
       "zpp_hpz_get_info: info is NULL", false},
      {"zpp_hpz_get_info", [] { return zpp_hpz_get_info(h, &tiny); }, INV,
       "zpp_hpz_get_info: info->struct_size 4: initialise with ZPP_HPZ_INFO_INIT", false},
      {"zpp_hpz_forward_gather",
       [] { return zpp_hpz_forward_gather(h, nullptr, b.data(), nullptr, nullptr); }, NUL,
       "zpp_hpz_forward_gather: sendbuf is NULL (count 4)", true},
      {"zpp_hpz_forward_gather",
       [] { return zpp_hpz_forward_gather(h, a.data(), nullptr, nullptr, nullptr); }, NUL,
       "zpp_hpz_forward_gather: recvbuf is NULL (count 4)", true},
      {"zpp_hpz_backward_gather",
       [] { return zpp_hpz_backward_gather(h, a.data(), nullptr, nullptr, nullptr); }, NUL,
       "zpp_hpz_backward_gather: recvbuf is NULL (count 4)", true},
  });
  EXPECT_EQ(zpp_hpz_destroy(h), ZPP_OK);
}

// ---- buffer overlap (zpp_coll.h, docs/collectives.md "Buffers") ------------
//
// Every collective with two (qgZ: three) caller buffers refuses any shared
// byte except its in-place form: ZPP_ERR_INVALID_ARGUMENT, before any
// transfer, with a message naming both buffers, their sizes and where one
// starts in the other.  The in-place forms and buffers that only touch
// (the end of one is the start of the other) give results bitwise equal
// to the out-of-place call, on the hierarchical communicator of the suite
// and on a flat one (g_flat), and on data large enough for the pipelined
// (chunked) paths of the transport, qwZ and qgZ.

zpp_comm_t g_flat = nullptr;  // ZPP_ALGORITHM_FLAT on MPI_COMM_WORLD (MPI launch)

uint64_t seed() {
  const char *s = std::getenv("ZPP_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261129ull;
}

// n random finite elements of dtype dt for rank r and test `tag`.
std::vector<uint8_t> rnd(zpp_dtype_t dt, size_t n, uint64_t tag, int r) {
  std::mt19937_64 rng(seed() * 7919ull + tag * 104729ull + (uint64_t)r);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint8_t> b(n * zpp_dtype_size(dt));
  for (size_t i = 0; i < n; i++) {
    float v = nd(rng);
    uint32_t u;
    std::memcpy(&u, &v, 4);
    if (dt == ZPP_FLOAT32) {
      std::memcpy(&b[4 * i], &v, 4);
    } else {
      uint16_t h = dt == ZPP_BFLOAT16
                       ? (uint16_t)(u >> 16)  // a bf16 value: fp32's top half
                       : (uint16_t)((u >> 31) << 15 | (uint32_t)(12 + rng() % 7) << 10 |
                                    (uint32_t)(rng() & 0x3ff));  // fp16, 2^-3..2^3
      std::memcpy(&b[2 * i], &h, 2);
    }
  }
  return b;
}

// "base + off" or "base - off": where a buffer starts relative to another.
std::string rel(const char *base, long long off) {
  return S("%s %c %lld", base, off < 0 ? '-' : '+', off < 0 ? -off : off);
}
// The two messages of zpp_coll_check_overlap: b (nb bytes at a + off)
// overlapping a (na bytes), with the in-place form (b == a + rank * nb)
// or none.
std::string msg_in_place(const char *func, const char *b, size_t nb, const char *a, long long off,
                         size_t na) {
  return S("%s: %s (%zu bytes at %s) overlaps %s (%zu bytes): only %s == %s + %zu (in place: "
           "rank %d x %zu bytes) may share memory with %s",
           func, b, nb, rel(a, off).c_str(), a, na, b, a, (size_t)g_rank * nb, g_rank, nb, a);
}
std::string msg_apart(const char *func, const char *b, size_t nb, const char *a, long long off,
                      size_t na) {
  return S("%s: %s (%zu bytes at %s) overlaps %s (%zu bytes): %s must not share memory with %s",
           func, b, nb, rel(a, off).c_str(), a, na, b, a);
}

// (a) Every refused overlap, on every rank alike (so no rank goes on into
// the collective): a slot that is not this rank's, a slot shifted by one
// element, a buffer starting before the other; qWD's target anywhere in
// recon (even its own slot); qgZ's residual in sendbuf or recvbuf.
TEST(ErrorText, OverlappingBuffers) {
  if (g_size < 2) GTEST_SKIP() << "another rank's slot needs 2+ ranks";
  const size_t c = 4, one = c * 4, all = one * (size_t)g_size;  // fp32
  const int nx = (g_rank + 1) % g_size;  // a slot that is not mine
  // room before and after: buffers placed at base + 64 floats
  static std::vector<float> mem(4096);
  static float *base;
  base = mem.data() + 64;
  static zpp_quant_config_t q = q8();
  static zpp_qgz_config_t g = ZPP_QGZ_CONFIG_INIT;
  static size_t rb;  // residual bytes of count c
  ASSERT_EQ(zpp_qgz_residual_bytes(g_comm, &g, c, &rb), ZPP_OK) << zpp_get_last_error();
  static int r, o;  // my slot and another rank's, for the lambdas
  r = g_rank;
  o = nx;
  const char *AG = "zpp_allgather", *RS = "zpp_reduce_scatter", *QW = "zpp_qwz_allgather",
             *QD = "zpp_qwd_allgather", *QG = "zpp_qgz_reduce_scatter",
             *HF = "zpp_hpz_forward_gather", *HB = "zpp_hpz_backward_gather";
  const long long sh = (long long)one * g_rank + 4;  // my slot, one element on
  check({
      // all-gather: sendbuf inside recvbuf elsewhere than its own slot
      {AG, [] { return zpp_allgather(g_comm, base + o * 4, base, 4, ZPP_FLOAT32, nullptr, nullptr); },
       INV, msg_in_place(AG, "sendbuf", one, "recvbuf", (long long)one * nx, all), true},
      {AG, [] { return zpp_allgather(g_comm, base + r * 4 + 1, base, 4, ZPP_FLOAT32, nullptr, nullptr); },
       INV, msg_in_place(AG, "sendbuf", one, "recvbuf", sh, all), true},
      {AG, [] { return zpp_allgather(g_comm, base - 2, base, 4, ZPP_FLOAT32, nullptr, nullptr); },
       INV, msg_in_place(AG, "sendbuf", one, "recvbuf", -8, all), true},
      // reduce-scatter: recvbuf inside sendbuf elsewhere than its own slot
      {RS,
       [] {
         return zpp_reduce_scatter(g_comm, base, base + o * 4, 4, ZPP_FLOAT32, ZPP_OP_SUM, nullptr,
                                   nullptr);
       },
       INV, msg_in_place(RS, "recvbuf", one, "sendbuf", (long long)one * nx, all), true},
      {RS,
       [] {
         return zpp_reduce_scatter(g_comm, base, base + r * 4 + 1, 4, ZPP_FLOAT32, ZPP_OP_MEAN,
                                   nullptr, nullptr);
       },
       INV, msg_in_place(RS, "recvbuf", one, "sendbuf", sh, all), true},
      {RS,
       [] {
         return zpp_reduce_scatter(g_comm, base, base - 1, 4, ZPP_FLOAT32, ZPP_OP_SUM, nullptr,
                                   nullptr);
       },
       INV, msg_in_place(RS, "recvbuf", one, "sendbuf", -4, all), true},
      // qwZ: as the all-gather
      {QW,
       [] {
         return zpp_qwz_allgather(g_comm, &q, base + o * 4, base, 4, ZPP_FLOAT32, nullptr, nullptr);
       },
       INV, msg_in_place(QW, "sendbuf", one, "recvbuf", (long long)one * nx, all), true},
      {QW,
       [] {
         return zpp_qwz_allgather(g_comm, &q, base + r * 4 + 1, base, 4, ZPP_FLOAT32, nullptr,
                                  nullptr);
       },
       INV, msg_in_place(QW, "sendbuf", one, "recvbuf", sh, all), true},
      // qWD: no in-place form at all
      {QD,
       [] { return zpp_qwd_allgather(g_comm, &q, base + r * 4, base, 4, ZPP_FLOAT32, nullptr, nullptr); },
       INV, msg_apart(QD, "target", one, "recon", (long long)one * g_rank, all), true},
      {QD,
       [] { return zpp_qwd_allgather(g_comm, &q, base - 3, base, 4, ZPP_FLOAT32, nullptr, nullptr); },
       INV, msg_apart(QD, "target", one, "recon", -12, all), true},
      // qgZ: sendbuf and recvbuf as the reduce-scatter; the residual apart
      {QG,
       [] {
         return zpp_qgz_reduce_scatter(g_comm, &g, base, base + o * 4, 4, ZPP_FLOAT32, ZPP_OP_SUM,
                                       nullptr, nullptr, nullptr);
       },
       INV, msg_in_place(QG, "recvbuf", one, "sendbuf", (long long)one * nx, all), true},
      {QG,
       [] {
         return zpp_qgz_reduce_scatter(g_comm, &g, base, base + 1024, 4, ZPP_FLOAT32, ZPP_OP_SUM,
                                       base + 3, nullptr, nullptr);
       },
       INV, msg_apart(QG, "residual", rb, "sendbuf", 12, all), true},
      {QG,
       [] {
         // recvbuf at base + 1024, the residual ending one element into it
         return zpp_qgz_reduce_scatter(g_comm, &g, base, base + 1024, 4, ZPP_FLOAT32, ZPP_OP_SUM,
                                       base + 1024 + 1 - (long)(rb / 4), nullptr, nullptr);
       },
       INV, msg_apart(QG, "residual", rb, "recvbuf", 4 - (long long)rb, one), true},
  });
  // hpZ gathers: as the all-gather; the backward one checks a sendbuf it
  // is given whether or not it will read it
  static zpp_hpz_t h = nullptr;
  zpp_hpz_config_t hc = ZPP_HPZ_CONFIG_INIT;
  ASSERT_EQ(zpp_hpz_create(g_comm, &hc, c, ZPP_FLOAT32, &h), ZPP_OK) << zpp_get_last_error();
  check({
      {HF, [] { return zpp_hpz_forward_gather(h, base + o * 4, base, nullptr, nullptr); }, INV,
       msg_in_place(HF, "sendbuf", one, "recvbuf", (long long)one * nx, all), true},
      {HF, [] { return zpp_hpz_forward_gather(h, base - 1, base, nullptr, nullptr); }, INV,
       msg_in_place(HF, "sendbuf", one, "recvbuf", -4, all), true},
      {HB, [] { return zpp_hpz_backward_gather(h, base + r * 4 + 1, base, nullptr, nullptr); }, INV,
       msg_in_place(HB, "sendbuf", one, "recvbuf", sh, all), true},
  });
  // a secondary copy exists now: the backward gather would not read
  // sendbuf, and still refuses it
  ASSERT_EQ(zpp_hpz_forward_gather(h, mem.data(), base, nullptr, nullptr), ZPP_OK)
      << zpp_get_last_error();
  check({
      {HB, [] { return zpp_hpz_backward_gather(h, base + o * 4, base, nullptr, nullptr); }, INV,
       msg_in_place(HB, "sendbuf", one, "recvbuf", (long long)one * nx, all), true},
  });
  EXPECT_EQ(zpp_hpz_destroy(h), ZPP_OK);
  // qWD's target is count floats whatever the dtype: on one rank a count
  // can fit size * count * 2 bytes and not count * 4 (its size is checked
  // before the overlap)
  static zpp_comm_t solo = nullptr;
  ASSERT_EQ(zpp_comm_split(g_comm, g_rank, 0, &solo), ZPP_OK) << zpp_get_last_error();
  check({
      {QD,
       [] {
         return zpp_qwd_allgather(solo, &q, base, base + 8, SIZE_MAX / 2, ZPP_FLOAT16, nullptr,
                                  nullptr);
       },
       OVF, S("%s: count %zu: target (count x 4 bytes) overflows size_t", QD, SIZE_MAX / 2),
       false},
  });
  EXPECT_EQ(zpp_comm_destroy(solo), ZPP_OK);
  // count 0: no byte is shared, whatever the pointers (none of these is an
  // in-place form), so every call is accepted and runs (on every rank)
  static zpp_hpz_t h0 = nullptr;
  ASSERT_EQ(zpp_hpz_create(g_comm, &hc, 0, ZPP_FLOAT32, &h0), ZPP_OK) << zpp_get_last_error();
  check({
      {AG, [] { return zpp_allgather(g_comm, base + 1, base, 0, ZPP_FLOAT32, nullptr, nullptr); },
       ZPP_OK, "", false},
      {RS,
       [] {
         return zpp_reduce_scatter(g_comm, base, base + 1, 0, ZPP_FLOAT32, ZPP_OP_SUM, nullptr,
                                   nullptr);
       },
       ZPP_OK, "", false},
      {QW, [] { return zpp_qwz_allgather(g_comm, &q, base + 1, base, 0, ZPP_FLOAT32, nullptr, nullptr); },
       ZPP_OK, "", false},
      {QD, [] { return zpp_qwd_allgather(g_comm, &q, base, base, 0, ZPP_FLOAT32, nullptr, nullptr); },
       ZPP_OK, "", false},
      {QG,
       [] {
         return zpp_qgz_reduce_scatter(g_comm, &g, base, base + 1, 0, ZPP_FLOAT32, ZPP_OP_SUM,
                                       base + 2, nullptr, nullptr);
       },
       ZPP_OK, "", false},
      {HF, [] { return zpp_hpz_forward_gather(h0, base + 1, base, nullptr, nullptr); }, ZPP_OK, "",
       false},
      {HB, [] { return zpp_hpz_backward_gather(h0, base + 1, base, nullptr, nullptr); }, ZPP_OK, "",
       false},
  });
  EXPECT_EQ(zpp_hpz_destroy(h0), ZPP_OK);
}

// How a call places its buffers.
enum Layout { OUT_OF_PLACE, IN_PLACE, SEND_THEN_RECV, RECV_THEN_SEND };
const char *layout_name(Layout l) {
  static const char *n[] = {"out of place", "in place", "recvbuf right after sendbuf",
                            "sendbuf right after recvbuf"};
  return n[l];
}

// One collective of two buffers, for the layouts below.
struct TwoBufs {
  std::string what;
  size_t send_bytes, recv_bytes;
  int form;  // in-place form: 0 none, 1 gather (send == recv + rank * send_bytes),
             // 2 scatter (recv == send + rank * recv_bytes)
  std::vector<uint8_t> send_init, recv_init;  // recv_init: recvbuf before the call
  std::function<zpp_status_t(const void *send, void *recv)> call;
};

// Runs c in layout l and returns recvbuf after it ("" and a failure when
// the call failed).
std::vector<uint8_t> run_layout(const TwoBufs &c, Layout l) {
  const size_t sb = c.send_bytes, rb = c.recv_bytes;
  std::vector<uint8_t> s = c.send_init, rv = c.recv_init, buf;
  const void *send = nullptr;
  void *recv = nullptr;
  size_t out = 0;  // where recvbuf starts in the buffer returned
  std::vector<uint8_t> *res = &buf;
  switch (l) {
  case OUT_OF_PLACE:
    send = s.data();
    recv = rv.data();
    res = &rv;
    break;
  case IN_PLACE:
    if (c.form == 1) {  // my shard already in my slot of recvbuf
      buf = c.recv_init;
      std::memcpy(buf.data() + (size_t)g_rank * sb, s.data(), sb);
      send = buf.data() + (size_t)g_rank * sb;
      recv = buf.data();
    } else {  // recvbuf is my slot of sendbuf
      buf = c.send_init;
      send = buf.data();
      out = (size_t)g_rank * rb;
      recv = buf.data() + out;
    }
    break;
  case SEND_THEN_RECV:
    buf = s;
    buf.insert(buf.end(), rv.begin(), rv.end());
    send = buf.data();
    out = sb;
    recv = buf.data() + out;
    break;
  case RECV_THEN_SEND:
    buf = rv;
    buf.insert(buf.end(), s.begin(), s.end());
    send = buf.data() + rb;
    recv = buf.data();
    break;
  }
  zpp_status_t st = c.call(send, recv);
  EXPECT_EQ(st, ZPP_OK) << c.what << ", " << layout_name(l) << ": " << zpp_get_last_error();
  if (st != ZPP_OK) return {};
  return std::vector<uint8_t>(res->begin() + (long)out, res->begin() + (long)(out + rb));
}

// (b) and (c): the in-place form (when there is one) and both adjacent
// placements give recvbuf bitwise equal to the out-of-place call.
void expect_layouts_equal(const TwoBufs &c) {
  std::vector<uint8_t> ref = run_layout(c, OUT_OF_PLACE);
  for (Layout l : {IN_PLACE, SEND_THEN_RECV, RECV_THEN_SEND}) {
    if (l == IN_PLACE && c.form == 0) continue;
    std::vector<uint8_t> got = run_layout(c, l);
    if (got.size() != ref.size()) continue;  // the call failed: reported
    size_t i = 0;
    while (i < ref.size() && got[i] == ref[i]) i++;
    EXPECT_EQ(i, ref.size()) << c.what << ", " << layout_name(l) << ": byte " << i << " of "
                             << ref.size() << " differs from the out-of-place call (seed "
                             << seed() << ")";
  }
}

// The suite's communicator (hierarchical at 2x2) and the flat one, named
// by the algorithm each runs.
std::vector<std::pair<const char *, zpp_comm_t>> comms() {
  std::vector<std::pair<const char *, zpp_comm_t>> v;
  for (zpp_comm_t c : {g_comm, g_flat}) {
    zpp_algorithm_t a = ZPP_ALGORITHM_DEFAULT;
    if (c == nullptr) continue;
    EXPECT_EQ(zpp_comm_algorithm(c, &a), ZPP_OK) << zpp_get_last_error();
    v.push_back({a == ZPP_ALGORITHM_HIER ? "hier" : "flat", c});
  }
  return v;
}

// Small (one block, one chunk) and large (several transport chunks, and
// qwZ/qgZ pipelined in chunks of ZPP_PIPE_MIN_CHUNK = 65536 elements).
const size_t kCounts[] = {10, 3 * 65536 + 18};

// Every dtype on the small count; the large one in fp32 only (the chunk
// boundaries, which the large count is for, do not depend on the dtype),
// to keep the suite short.
std::vector<zpp_dtype_t> dtypes(size_t count, std::vector<zpp_dtype_t> all) {
  if (count > kCounts[0]) return {ZPP_FLOAT32};
  return all;
}

std::string tag(const char *coll, const char *comm, size_t count, zpp_dtype_t dt) {
  return S("%s (%s, count %zu, %s)", coll, comm, count, zpp_dtype_name(dt));
}

TEST(Overlap, BaselinesInPlaceAndAdjacentEqualOutOfPlace) {
  if (g_rank == 0) std::printf("seed ZPP_TEST_SEED=%llu\n", (unsigned long long)seed());
  const size_t n = (size_t)g_size;
  for (auto cm : comms()) {
    zpp_comm_t comm = cm.second;
    for (size_t count : kCounts) {
      for (zpp_dtype_t dt : dtypes(count, {ZPP_FLOAT32, ZPP_BFLOAT16, ZPP_FLOAT16})) {
        const size_t one = count * zpp_dtype_size(dt);
        TwoBufs ag{tag("zpp_allgather", cm.first, count, dt), one, n * one, 1,
                   rnd(dt, count, 1, g_rank), std::vector<uint8_t>(n * one, 0x5a),
                   [=](const void *s, void *r) {
                     return zpp_allgather(comm, s, r, count, dt, nullptr, nullptr);
                   }};
        expect_layouts_equal(ag);
        for (zpp_redop_t op : {ZPP_OP_SUM, ZPP_OP_MEAN}) {
          TwoBufs rs{tag(op == ZPP_OP_SUM ? "zpp_reduce_scatter SUM" : "zpp_reduce_scatter MEAN",
                         cm.first, count, dt),
                     n * one, one, 2, rnd(dt, n * count, 2, g_rank),
                     std::vector<uint8_t>(one, 0x5a), [=](const void *s, void *r) {
                       return zpp_reduce_scatter(comm, s, r, count, dt, op, nullptr, nullptr);
                     }};
          expect_layouts_equal(rs);
        }
      }
    }
  }
}

TEST(Overlap, QuantizedInPlaceAndAdjacentEqualOutOfPlace) {
  if (g_rank == 0) std::printf("seed ZPP_TEST_SEED=%llu\n", (unsigned long long)seed());
  const size_t n = (size_t)g_size;
  zpp_quant_config_t q4 = q8();
  q4.bits = 4;
  q4.block_size = 64;
  q4.rounding = ZPP_ROUND_STOCHASTIC;  // draws at the element's index
  q4.seed = seed();
  for (auto cm : comms()) {
    zpp_comm_t comm = cm.second;
    for (size_t count : kCounts) {
      for (zpp_dtype_t dt : dtypes(count, {ZPP_FLOAT32, ZPP_BFLOAT16})) {
        const size_t one = count * zpp_dtype_size(dt);
        std::vector<uint8_t> shard = rnd(dt, count, 3, g_rank);
        std::vector<uint8_t> fill(n * one, 0x5a);
        TwoBufs qwz{tag("zpp_qwz_allgather", cm.first, count, dt), one, n * one, 1, shard, fill,
                    [=](const void *s, void *r) {
                      return zpp_qwz_allgather(comm, &q4, s, r, count, dt, nullptr, nullptr);
                    }};
        expect_layouts_equal(qwz);
        // hpZ, quantized and not: forward; backward from the secondary copy
        // (which does not read sendbuf); backward refreshing (which does)
        for (int quantized : {1, 0}) {
          zpp_hpz_config_t hc = ZPP_HPZ_CONFIG_INIT;
          hc.quantized = quantized;
          for (int kind = 0; kind < 3; kind++) {
            static const char *kinds[] = {"zpp_hpz_forward_gather", "zpp_hpz_backward_gather",
                                          "zpp_hpz_backward_gather (refresh)"};
            std::vector<uint8_t> own = shard;  // the primary shard, apart
            TwoBufs hz{tag(kinds[kind], cm.first, count, dt) +
                           (quantized ? " quantized" : " full precision"),
                       one, n * one, 1, shard, fill, [=](const void *s, void *r) {
                         zpp_hpz_t h = nullptr;
                         std::vector<uint8_t> tmp(n * one), src = own;
                         zpp_status_t st = zpp_hpz_create(comm, &hc, count, dt, &h);
                         if (st == ZPP_OK && kind == 0)
                           st = zpp_hpz_forward_gather(h, s, r, nullptr, nullptr);
                         if (st == ZPP_OK && kind > 0)
                           st = zpp_hpz_forward_gather(h, src.data(), tmp.data(), nullptr, nullptr);
                         if (st == ZPP_OK && kind == 2) st = zpp_hpz_invalidate(h);
                         if (st == ZPP_OK && kind > 0)
                           st = zpp_hpz_backward_gather(h, s, r, nullptr, nullptr);
                         zpp_hpz_destroy(h);
                         return st;
                       }};
            expect_layouts_equal(hz);
          }
        }
        // qgZ: default; and the Hadamard rotation with stochastic rounding
        // and an fp32 error-feedback residual (whose new value must match
        // too, and which must not touch either buffer)
        for (int variant = 0; variant < 2; variant++) {
          zpp_qgz_config_t g = ZPP_QGZ_CONFIG_INIT;
          size_t rbytes = 0;
          if (variant == 1) {
            g.hadamard = ZPP_QGZ_HADAMARD_DEFAULT;
            g.rounding = ZPP_ROUND_STOCHASTIC;
            g.seed = seed() + 1;
            ASSERT_EQ(zpp_qgz_residual_bytes(comm, &g, count, &rbytes), ZPP_OK)
                << zpp_get_last_error();
          }
          // residual (when used) starting random, the same for every layout
          std::vector<uint8_t> res0 = rnd(ZPP_FLOAT32, rbytes / 4, 5, g_rank);
          auto residuals = std::make_shared<std::vector<std::vector<uint8_t>>>();
          TwoBufs qg{tag(variant ? "zpp_qgz_reduce_scatter (hadamard, stochastic, residual)"
                                 : "zpp_qgz_reduce_scatter",
                         cm.first, count, dt),
                     n * one, one, 2, rnd(dt, n * count, 4, g_rank), std::vector<uint8_t>(one, 0x5a),
                     [=](const void *s, void *r) {
                       residuals->push_back(res0);
                       void *res = rbytes ? residuals->back().data() : nullptr;
                       return zpp_qgz_reduce_scatter(comm, &g, s, r, count, dt, ZPP_OP_MEAN, res,
                                                     nullptr, nullptr);
                     }};
          expect_layouts_equal(qg);
          for (size_t i = 1; i < residuals->size(); i++)
            EXPECT_TRUE((*residuals)[i] == (*residuals)[0])
                << qg.what << ": the residual of call " << i << " differs from the out-of-place one";
        }
      }
    }
  }
}

// qWD has no in-place form; target right before or after recon works.
// recon starts the same on every rank (as the call requires).
TEST(Overlap, QwdAdjacentEqualsApart) {
  if (g_rank == 0) std::printf("seed ZPP_TEST_SEED=%llu\n", (unsigned long long)seed());
  const size_t n = (size_t)g_size;
  zpp_quant_config_t q = q8();
  for (auto cm : comms()) {
    zpp_comm_t comm = cm.second;
    for (size_t count : kCounts) {
      for (zpp_dtype_t dt : dtypes(count, {ZPP_FLOAT32, ZPP_BFLOAT16})) {
        TwoBufs qd{tag("zpp_qwd_allgather", cm.first, count, dt), count * 4,
                   n * count * zpp_dtype_size(dt), 0, rnd(ZPP_FLOAT32, count, 6, g_rank),
                   rnd(dt, n * count, 7, 0), [=](const void *s, void *r) {
                     return zpp_qwd_allgather(comm, &q, (const float *)s, r, count, dt, nullptr,
                                              nullptr);
                   }};
        expect_layouts_equal(qd);
      }
    }
  }
}

// qgZ's residual right after sendbuf and right before recvbuf.
TEST(Overlap, QgzResidualAdjacentEqualsApart) {
  if (g_rank == 0) std::printf("seed ZPP_TEST_SEED=%llu\n", (unsigned long long)seed());
  const size_t n = (size_t)g_size, count = 10;
  zpp_qgz_config_t g = ZPP_QGZ_CONFIG_INIT;
  size_t rb = 0;
  ASSERT_EQ(zpp_qgz_residual_bytes(g_comm, &g, count, &rb), ZPP_OK) << zpp_get_last_error();
  const size_t sb = n * count * 4, ob = count * 4;
  std::vector<uint8_t> in = rnd(ZPP_FLOAT32, n * count, 8, g_rank);
  std::vector<uint8_t> res0 = rnd(ZPP_FLOAT32, rb / 4, 9, g_rank);
  // apart: the reference
  std::vector<uint8_t> s = in, r(ob), res = res0;
  ASSERT_EQ(zpp_qgz_reduce_scatter(g_comm, &g, s.data(), r.data(), count, ZPP_FLOAT32, ZPP_OP_SUM,
                                   res.data(), nullptr, nullptr),
            ZPP_OK)
      << zpp_get_last_error();
  // [sendbuf | residual] [recvbuf], then [sendbuf] [residual | recvbuf]
  for (int where = 0; where < 2; where++) {
    std::vector<uint8_t> pair, other;
    if (where == 0) {
      pair = in;
      pair.insert(pair.end(), res0.begin(), res0.end());
      other.assign(ob, 0x5a);
    } else {
      pair = res0;
      pair.resize(rb + ob, 0x5a);
      other = in;
    }
    void *send = where == 0 ? pair.data() : other.data();
    void *resid = where == 0 ? pair.data() + sb : pair.data();
    void *recv = where == 0 ? other.data() : pair.data() + rb;
    ASSERT_EQ(zpp_qgz_reduce_scatter(g_comm, &g, send, recv, count, ZPP_FLOAT32, ZPP_OP_SUM, resid,
                                     nullptr, nullptr),
              ZPP_OK)
        << zpp_get_last_error();
    EXPECT_EQ(std::memcmp(recv, r.data(), ob), 0) << "recvbuf, residual placement " << where;
    EXPECT_EQ(std::memcmp(resid, res.data(), rb), 0) << "residual, placement " << where;
  }
}

// The check is local: one rank's buffers may overlap where the others'
// do not.  With ZPP_CHECK=1 that rank returns its own error and every
// other rank ZPP_ERR_MISMATCH naming it, and no rank starts the
// collective (ctest: errors_overlap_ucx_uneven).
TEST(Overlap, OneRankRefusedFailsEveryRankWithZppCheck) {
  const char *check_env = std::getenv("ZPP_CHECK");
  if (!(check_env && std::atoi(check_env) == 1) || g_size < 2)
    GTEST_SKIP() << "needs ZPP_CHECK=1 and 2+ ranks (ctest runs it as errors_overlap_ucx_uneven)";
  const size_t count = 4, one = count * 4, all = one * (size_t)g_size;
  const int culprit = g_size - 1, nx = (g_rank + 1) % g_size;
  std::vector<float> buf((size_t)g_size * count, 1.0f);
  float *recv = buf.data();
  // the others in place, the culprit in another rank's slot
  const float *send = recv + (size_t)(g_rank == culprit ? nx : g_rank) * count;
  zpp_status_t st = zpp_allgather(g_comm, send, recv, count, ZPP_FLOAT32, nullptr, nullptr);
  if (g_rank == culprit) {
    EXPECT_EQ(st, ZPP_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(zpp_comm_get_last_error(g_comm)),
              msg_in_place("zpp_allgather", "sendbuf", one, "recvbuf", (long long)one * nx, all));
  } else {
    EXPECT_EQ(st, ZPP_ERR_MISMATCH);
    EXPECT_EQ(std::string(zpp_comm_get_last_error(g_comm)),
              S("zpp_allgather: ZPP_CHECK: rank %d failed its argument checks (%s); this is rank %d",
                culprit, zpp_status_string(ZPP_ERR_INVALID_ARGUMENT), g_rank));
  }
  // nobody started it: the in-place call on every rank works afterwards
  for (size_t i = 0; i < count; i++) recv[(size_t)g_rank * count + i] = (float)(g_rank * 10 + (int)i);
  ASSERT_EQ(zpp_allgather(g_comm, recv + (size_t)g_rank * count, recv, count, ZPP_FLOAT32, nullptr,
                          nullptr),
            ZPP_OK)
      << zpp_get_last_error();
  for (int r = 0; r < g_size; r++)
    for (size_t i = 0; i < count; i++)
      EXPECT_EQ(recv[(size_t)r * count + i], (float)(r * 10 + (int)i)) << "rank " << r << " element " << i;
}

// ---- runtime (zpp_runtime.h) ------------------------------------------------

TEST(ErrorText, Runtime) {
  static const size_t sizes[] = {1000};
  static zpp_pgroup_t pg = nullptr, out = nullptr;
  static zpp_pgroup_info_t tiny;
  tiny.struct_size = 4;
  static size_t off, cnt;
  static void *p;
  static std::vector<uint16_t> gbuf(4096 * 16), sbuf(4096);
  static std::vector<float> master(4096);
  check({
      {"zpp_pgroup_create", [] { return zpp_pgroup_create(nullptr, nullptr, sizes, 1, &out); }, NUL,
       "zpp_pgroup_create: comm is NULL", false},
      {"zpp_pgroup_create", [] { return zpp_pgroup_create(g_comm, nullptr, sizes, 1, nullptr); },
       NUL, "zpp_pgroup_create: out is NULL", false},
      {"zpp_pgroup_create", [] { return zpp_pgroup_create(g_comm, nullptr, sizes, -1, &out); }, INV,
       "zpp_pgroup_create: ntensors -1: must be >= 0", false},
      {"zpp_pgroup_create", [] { return zpp_pgroup_create(g_comm, nullptr, nullptr, 1, &out); },
       NUL, "zpp_pgroup_create: sizes is NULL (ntensors 1)", false},
      {"zpp_pgroup_destroy", [] { return zpp_pgroup_destroy(nullptr); }, ZPP_OK, "", false},
  });
  // every field of zpp_pgroup_config_t
  struct C {
    std::function<void(zpp_pgroup_config_t *)> set;
    std::string text;
  };
  const C cs[] = {
      {[](zpp_pgroup_config_t *c) { c->struct_size = 8; },
       S("cfg->struct_size 8: must be sizeof(zpp_pgroup_config_t) = %zu (use "
         "ZPP_PGROUP_CONFIG_INIT)", sizeof(zpp_pgroup_config_t))},
      {[](zpp_pgroup_config_t *c) { c->dtype = (zpp_dtype_t)7; },
       std::string("cfg->dtype 7: ") + kDtypeMust},
      {[](zpp_pgroup_config_t *c) { c->qwz_bits = 5; }, "cfg->qwz_bits 5: must be 0 (off), 4 or 8"},
      {[](zpp_pgroup_config_t *c) { c->qgz_bits = 2; }, "cfg->qgz_bits 2: must be 0 (off), 4 or 8"},
      {[](zpp_pgroup_config_t *c) { c->qgz_intra_bits = 3; },
       "cfg->qgz_intra_bits 3: must be 0 (qgz_bits), 4, 8 or 16 (ZPP_QGZ_INTRA_RAW: not quantized inside the node)"},
      {[](zpp_pgroup_config_t *c) { c->qwz_bits = 8; c->qwz_block = 0; },
       "cfg->qwz_block 0: must be >= 1"},
      {[](zpp_pgroup_config_t *c) { c->qgz_bits = 4; c->qgz_block = 0; },
       "cfg->qgz_block 0: must be >= 1"},
      {[](zpp_pgroup_config_t *c) { c->hpz = 2; }, "cfg->hpz 2: must be 0 or 1"},
      {[](zpp_pgroup_config_t *c) { c->error_feedback = 3; },
       "cfg->error_feedback 3: must be 0 or 1"},
      {[](zpp_pgroup_config_t *c) { c->error_feedback = 1; },
       "cfg->error_feedback 1: needs cfg->qgz_bits 4 or 8 (the baseline reduce-scatter has no "
       "compression error)"},
      {[](zpp_pgroup_config_t *c) { c->qwd_bits = 3; }, "cfg->qwd_bits 3: must be 0 (off), 4 or 8"},
      {[](zpp_pgroup_config_t *c) { c->qwd_bits = 4; c->qwd_block = 0; },
       "cfg->qwd_block 0: must be >= 1"},
      {[](zpp_pgroup_config_t *c) { c->qwd_bits = 4; c->hpz = 1; },
       "cfg->qwd_bits 4: qWD groups keep the full parameters and gather differences; qwz_bits "
       "and hpz must be 0"},
      {[](zpp_pgroup_config_t *c) { c->qgz_bits = 4; c->qgz_hadamard = 3; },
       "cfg->qgz_hadamard 3: must be 0, or (with qgz_bits) a power of two >= 2 that divides "
       "qgz_block 256"},
      {[](zpp_pgroup_config_t *c) { c->rounding = (zpp_rounding_t)9; },
       "cfg->rounding 9: must be ZPP_ROUND_NEAREST or ZPP_ROUND_STOCHASTIC"},
      {[](zpp_pgroup_config_t *c) { c->error_feedback_bits = 16; },
       "cfg->error_feedback_bits 16: must be 32 (fp32) or 8 (INT8)"},
      {[](zpp_pgroup_config_t *c) { c->error_feedback_beta = -1.0f; },
       "cfg->error_feedback_beta -1: must be in [0, 1) (0: plain error feedback; LoCo: 0.8)"},
  };
  std::vector<Row> rows;
  for (const C &x : cs) {
    zpp_pgroup_config_t c = ZPP_PGROUP_CONFIG_INIT;
    x.set(&c);
    rows.push_back({"zpp_pgroup_create",
                    [c] { return zpp_pgroup_create(g_comm, &c, sizes, 1, &out); }, INV,
                    "zpp_pgroup_create: " + x.text, false});
  }
  check(rows);
  zpp_pgroup_config_t qc = ZPP_PGROUP_CONFIG_INIT;
  qc.qgz_bits = 4;
  ASSERT_EQ(zpp_pgroup_create(g_comm, &qc, sizes, 1, &pg), ZPP_OK) << zpp_get_last_error();
  static std::vector<float> dummy(4096);
  check({
      {"zpp_pgroup_get_info", [] { return zpp_pgroup_get_info(nullptr, &tiny); }, NUL,
       "zpp_pgroup_get_info: pg is NULL", false},
      {"zpp_pgroup_get_info", [] { return zpp_pgroup_get_info(pg, nullptr); }, NUL,
       "zpp_pgroup_get_info: info is NULL", false},
      {"zpp_pgroup_get_info", [] { return zpp_pgroup_get_info(pg, &tiny); }, INV,
       S("zpp_pgroup_get_info: info->struct_size 4: must be %zu (use ZPP_PGROUP_INFO_INIT)",
         sizeof(zpp_pgroup_info_t)), false},
      {"zpp_pgroup_tensor", [] { return zpp_pgroup_tensor(nullptr, 0, &off, &cnt, nullptr, nullptr); },
       NUL, "zpp_pgroup_tensor: pg is NULL", false},
      {"zpp_pgroup_tensor", [] { return zpp_pgroup_tensor(pg, 1, &off, &cnt, nullptr, nullptr); },
       INV, "zpp_pgroup_tensor: t 1: must be in [0, 1)", false},
      {"zpp_pgroup_attach", [] { return zpp_pgroup_attach(nullptr, nullptr, nullptr, nullptr); },
       NUL, "zpp_pgroup_attach: pg is NULL", false},
      {"zpp_pgroup_attach", [] { return zpp_pgroup_attach(pg, nullptr, nullptr, dummy.data()); },
       INV, "zpp_pgroup_attach: residual: given but the group keeps none "
            "(cfg->error_feedback 0)", false},
      {"zpp_pgroup_residual_count", [] { return zpp_pgroup_residual_count(nullptr, &cnt); }, NUL,
       "zpp_pgroup_residual_count: pg is NULL", false},
      {"zpp_pgroup_residual_count", [] { return zpp_pgroup_residual_count(pg, nullptr); }, NUL,
       "zpp_pgroup_residual_count: count is NULL", false},
      {"zpp_pgroup_shard", [] { return zpp_pgroup_shard(nullptr, &p); }, NUL,
       "zpp_pgroup_shard: pg is NULL", false},
      {"zpp_pgroup_shard", [] { return zpp_pgroup_shard(pg, nullptr); }, NUL,
       "zpp_pgroup_shard: shard is NULL", false},
      {"zpp_pgroup_fetch", [] { return zpp_pgroup_fetch(nullptr, ZPP_FETCH_FORWARD, nullptr); },
       NUL, "zpp_pgroup_fetch: pg is NULL", false},
      {"zpp_pgroup_fetch", [] { return zpp_pgroup_fetch(pg, (zpp_fetch_t)4, nullptr); }, INV,
       "zpp_pgroup_fetch: kind 4: must be ZPP_FETCH_FORWARD or ZPP_FETCH_BACKWARD", false},
      {"zpp_pgroup_wait", [] { return zpp_pgroup_wait(nullptr, &p); }, NUL,
       "zpp_pgroup_wait: pg is NULL", false},
      {"zpp_pgroup_wait", [] { return zpp_pgroup_wait(pg, &p); }, INV,
       "zpp_pgroup_wait: pg: nothing fetched (none since the last release or params_changed): "
       "call zpp_pgroup_fetch first", false},
      {"zpp_pgroup_release", [] { return zpp_pgroup_release(nullptr); }, NUL,
       "zpp_pgroup_release: pg is NULL", false},
      {"zpp_pgroup_reduce_gradients",
       [] { return zpp_pgroup_reduce_gradients(nullptr, gbuf.data(), sbuf.data(), ZPP_OP_SUM, nullptr, nullptr); },
       NUL, "zpp_pgroup_reduce_gradients: pg is NULL", false},
      {"zpp_pgroup_reduce_gradients",
       [] { return zpp_pgroup_reduce_gradients(pg, nullptr, sbuf.data(), ZPP_OP_SUM, nullptr, nullptr); },
       NUL, "zpp_pgroup_reduce_gradients: full_grad is NULL", false},
      {"zpp_pgroup_reduce_gradients",
       [] { return zpp_pgroup_reduce_gradients(pg, gbuf.data(), nullptr, ZPP_OP_SUM, nullptr, nullptr); },
       NUL, "zpp_pgroup_reduce_gradients: grad_shard is NULL", false},
      {"zpp_pgroup_reduce_gradients",
       [] { return zpp_pgroup_reduce_gradients(pg, gbuf.data(), sbuf.data(), (zpp_redop_t)9, nullptr, nullptr); },
       INV, "zpp_pgroup_reduce_gradients: op 9: must be ZPP_OP_SUM or ZPP_OP_MEAN", false},
      {"zpp_pgroup_update_params", [] { return zpp_pgroup_update_params(nullptr, master.data(), nullptr); },
       NUL, "zpp_pgroup_update_params: pg is NULL", false},
      {"zpp_pgroup_update_params", [] { return zpp_pgroup_update_params(pg, master.data(), nullptr); },
       INV, "zpp_pgroup_update_params: pg: the group has no qWD (cfg->qwd_bits 0): write the shard "
            "and fetch instead", false},
      {"zpp_pgroup_params_changed", [] { return zpp_pgroup_params_changed(nullptr); }, NUL,
       "zpp_pgroup_params_changed: pg is NULL", false},
      {"zpp_pgroup_recover",
       [] {
         zpp_pgroup_t np = nullptr;
         int map[64] = {0};
         return zpp_pgroup_recover(nullptr, g_comm, map, &np, nullptr);
       },
       NUL, "zpp_pgroup_recover: old is NULL", false},
      {"zpp_pgroup_recover",
       [] {
         zpp_pgroup_t np = nullptr;
         int map[64] = {0};
         return zpp_pgroup_recover(pg, g_comm, map, &np, nullptr);
       },
       INV, "zpp_pgroup_recover: newcomm is the old group's communicator: pass the one "
            "zpp_comm_shrink returned", false},
      {"zpp_pgroup_lost", [] { return zpp_pgroup_lost(nullptr, 0, nullptr, nullptr, nullptr, nullptr); },
       NUL, "zpp_pgroup_lost: pg is NULL", false},
      {"zpp_pgroup_lost", [] { return zpp_pgroup_lost(pg, 0, nullptr, nullptr, nullptr, nullptr); },
       INV, "zpp_pgroup_lost: pg: not made by zpp_pgroup_recover", false},
      {"zpp_pgroup_recover_state",
       [] { return zpp_pgroup_recover_state(nullptr, master.data(), master.data(), 4); }, NUL,
       "zpp_pgroup_recover_state: pg is NULL", false},
      {"zpp_pgroup_recover_state",
       [] { return zpp_pgroup_recover_state(pg, master.data(), master.data(), 4); }, INV,
       "zpp_pgroup_recover_state: pg: not made by zpp_pgroup_recover", false},
  });
  EXPECT_EQ(zpp_pgroup_destroy(pg), ZPP_OK);
  zpp_pgroup_config_t wc = ZPP_PGROUP_CONFIG_INIT;
  wc.qwd_bits = 4;
  ASSERT_EQ(zpp_pgroup_create(g_comm, &wc, sizes, 1, &pg), ZPP_OK) << zpp_get_last_error();
  check({
      {"zpp_pgroup_update_params", [] { return zpp_pgroup_update_params(pg, nullptr, nullptr); },
       NUL, "zpp_pgroup_update_params: master_shard is NULL", false},
      {"zpp_pgroup_fetch", [] { return zpp_pgroup_fetch(pg, ZPP_FETCH_FORWARD, nullptr); }, INV,
       "zpp_pgroup_fetch: pg: a qWD group (cfg->qwd_bits 4) keeps the full parameters; refresh "
       "them with zpp_pgroup_update_params", false},
  });
  // Attached buffers follow the collectives' overlap rule (zpp_runtime.h):
  // the master shard inside the qWD full buffer is refused ...
  static std::vector<uint16_t> full(4096 * 16);
  zpp_pgroup_info_t wi = ZPP_PGROUP_INFO_INIT;
  ASSERT_EQ(zpp_pgroup_get_info(pg, &wi), ZPP_OK) << zpp_get_last_error();
  ASSERT_LE(wi.padded_numel, full.size());
  ASSERT_EQ(zpp_pgroup_attach(pg, nullptr, full.data(), nullptr), ZPP_OK) << zpp_get_last_error();
  check({
      {"zpp_pgroup_update_params",
       [] { return zpp_pgroup_update_params(pg, reinterpret_cast<float *>(full.data()), nullptr); },
       INV,
       msg_apart("zpp_qwd_allgather", "target", wi.shard_numel * 4, "recon", 0,
                 wi.padded_numel * 2),
       false},
  });
  EXPECT_EQ(zpp_pgroup_destroy(pg), ZPP_OK);
  // ... and a shard (gradient shard) in another rank's slot of the full
  // buffer (gradient) too, while this rank's own slot is the in-place form
  // and works
  zpp_pgroup_config_t pc = ZPP_PGROUP_CONFIG_INIT;
  pc.align = 1;
  ASSERT_EQ(zpp_pgroup_create(g_comm, &pc, sizes, 1, &pg), ZPP_OK) << zpp_get_last_error();
  zpp_pgroup_info_t info = ZPP_PGROUP_INFO_INIT;
  ASSERT_EQ(zpp_pgroup_get_info(pg, &info), ZPP_OK) << zpp_get_last_error();
  static size_t sn;
  static int o;
  sn = info.shard_numel;
  o = (g_rank + 1) % g_size;
  const size_t one = sn * 2, all = one * (size_t)g_size;
  if (g_size > 1) {
    ASSERT_EQ(zpp_pgroup_attach(pg, full.data() + (size_t)o * sn, full.data(), nullptr), ZPP_OK);
    check({
        {"zpp_pgroup_fetch", [] { return zpp_pgroup_fetch(pg, ZPP_FETCH_FORWARD, nullptr); }, INV,
         msg_in_place("zpp_allgather", "sendbuf", one, "recvbuf", (long long)(o * one), all),
         false},
        {"zpp_pgroup_reduce_gradients",
         [] {
           return zpp_pgroup_reduce_gradients(pg, full.data(), full.data() + (size_t)o * sn,
                                              ZPP_OP_SUM, nullptr, nullptr);
         },
         INV, msg_in_place("zpp_reduce_scatter", "recvbuf", one, "sendbuf", (long long)(o * one), all),
         false},
    });
  }
  // in place: element i of rank r's shard holds (r + 1) * 8 + i % 8, exact
  // in bf16 (integers below 256); the fetch gathers every shard into its
  // slot, then the in-place reduction of that full buffer leaves in my
  // slot the sum over the ranks of their copies of it: size x my values
  auto bf = [](float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return (uint16_t)(u >> 16);
  };
  auto val = [](int r, size_t i) { return (float)((r + 1) * 8 + (int)(i % 8)); };
  auto f32 = [](uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float v;
    std::memcpy(&v, &u, 4);
    return v;
  };
  uint16_t *mine = full.data() + (size_t)g_rank * sn;
  for (size_t i = 0; i < sn; i++) mine[i] = bf(val(g_rank, i));
  ASSERT_EQ(zpp_pgroup_attach(pg, mine, full.data(), nullptr), ZPP_OK);
  ASSERT_EQ(zpp_pgroup_fetch(pg, ZPP_FETCH_FORWARD, nullptr), ZPP_OK) << zpp_get_last_error();
  ASSERT_EQ(zpp_pgroup_wait(pg, &p), ZPP_OK) << zpp_get_last_error();
  size_t bad = 0;
  for (int r = 0; r < g_size; r++)
    for (size_t i = 0; i < sn; i++)
      if (f32(full[(size_t)r * sn + i]) != val(r, i) && bad++ < 4)
        ADD_FAILURE() << "in-place fetch: slot of rank " << r << ", element " << i << ": "
                      << f32(full[(size_t)r * sn + i]) << ", want " << val(r, i);
  EXPECT_EQ(bad, 0u);
  ASSERT_EQ(zpp_pgroup_reduce_gradients(pg, full.data(), mine, ZPP_OP_SUM, nullptr, nullptr), ZPP_OK)
      << zpp_get_last_error();
  for (size_t i = 0; i < sn; i++)
    if (f32(mine[i]) != (float)g_size * val(g_rank, i) && bad++ < 4)
      ADD_FAILURE() << "in-place reduce_gradients: element " << i << ": " << f32(mine[i])
                    << ", want " << (float)g_size * val(g_rank, i);
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(zpp_pgroup_destroy(pg), ZPP_OK);
}

// Every ZPP_API function of include/zpp/*.h has a row above, or is one
// whose arguments cannot be bad (every value has an answer, checked in the
// tests above).
TEST(ErrorText, EveryPublicFunctionHasRows) {
  const std::set<std::string> no_bad_args = {
      "zpp_status_string", "zpp_get_last_error", "zpp_dtype_size", "zpp_dtype_name",
      "zpp_quant_cpu_isa", "zpp_cuda_available", "zpp_link_name", "zpp_group_name",
      "zpp_backend_name", "zpp_comm_bootstrap_name", "zpp_comm_get_last_error"};
  const char *headers[] = {"zpp.h", "zpp_comm.h", "zpp_mpi.h", "zpp_coll.h", "zpp_runtime.h"};
  std::regex decl("ZPP_API[^;(]*[ *](zpp_[a-z0-9_]+)\\(");
  int n = 0;
  for (const char *h : headers) {
    std::ifstream f(std::string(ZPP_SOURCE_DIR) + "/include/zpp/" + h);
    ASSERT_TRUE(f.good()) << h;
    std::stringstream ss;
    ss << f.rdbuf();
    std::string text = ss.str();
    for (std::sregex_iterator it(text.begin(), text.end(), decl), end; it != end; ++it) {
      std::string fn = (*it)[1];
      n++;
      EXPECT_TRUE(covered().count(fn) || no_bad_args.count(fn))
          << fn << " (" << h << ") has no row in tests/test_errors.cc";
    }
  }
  EXPECT_GT(n, 60) << "the declaration pattern found too few functions";
  if (g_rank == 0)
    std::printf("[ info ] %d public functions, %zu with rows, %d rows\n", n, covered().size(),
                g_rows);
}

void setup() {
  zpp_test::OpenComm(0, &g_comm, &g_rank, &g_size, &g_nnodes, &g_uniform);
  if (zpp_test::UsesMpi()) {  // the overlap tests run on the flat algorithm too
    zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
    cfg.algorithm = ZPP_ALGORITHM_FLAT;
    if (zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &g_flat) != ZPP_OK)
      zpp_test::Die("zpp_comm_create_mpi (flat)");
  }
}

void teardown() {
  zpp_comm_destroy(g_flat);
  zpp_comm_destroy(g_comm);
}

}  // namespace

int main(int argc, char **argv) {
  return zpp_test::RunAllRanks(argc, argv, setup, teardown);
}
