/*
 * libFuzzer target: zpp_quant_decode / zpp_quant_decode_accumulate (and
 * zpp_quant_encode) of arbitrary bytes under arbitrary configurations,
 * through the public API of <zpp/zpp.h>.
 *
 * Input: a 24-byte header (missing bytes read as 0), then the payload.
 *   0      struct_size choice (% 4: sizeof, the 0.1 size, 0, 0.1 size - 1)
 *   1      bits (int8: 8, 4 and anything else)
 *   2..5   block size, low 32 bits (little-endian)
 *   6      block size shift (% 64)
 *   7      mode (int8)      8  rounding (int8)     9  dtype (int8)
 *   10..13 count, low 32 bits           14  count shift (% 64)
 *   15     operation (% 3: decode, decode_accumulate, encode)
 *   16..23 seed
 * The payload is the encoded buffer (decode), or the elements (encode).
 *
 * What must hold (otherwise abort(), which libFuzzer reports):
 *   - a config that zpp_quant_config_check rejects is rejected by every
 *     call, with a message;
 *   - an accepted call never reads past the payload nor writes past an
 *     output of exactly `count` elements (ASan checks the bytes);
 *   - every CPU path (scalar, AVX2, AVX-512 where this CPU has them)
 *     writes the same bits as the public call (docs/format.md).
 */
#include <zpp/zpp.h>

#include "kernels/quant_cpu.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HDR 24
/* Outputs larger than this are not allocated: the call must then fail,
 * since the payload cannot hold that many elements. */
#define MAX_OUT_ELEMS ((size_t)1 << 22)

static uint64_t le(const uint8_t *p, int n) {
  uint64_t v = 0;
  int i;
  for (i = n - 1; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

/* Inputs run, and calls that encoded or decoded at least one element
 * (run.sh requires some among the committed inputs: not a vacuous run). */
static unsigned long n_inputs, n_accepted;

static void summary(void) {
  fprintf(stderr, "fuzz_quant_decode: %lu inputs, %lu accepted\n", n_inputs,
          n_accepted);
}

static void fail(const char *what, zpp_status_t st) {
  fprintf(stderr, "fuzz_quant_decode: %s (status %d: %s)\n", what, (int)st,
          zpp_get_last_error());
  abort();
}

/* The other CPU paths on the same validated input: same bits. */
static void compare_paths(const zpp_quant_config_t *cfg, const uint8_t *src,
                          size_t count, int out_kind, const void *expect,
                          const void *acc_before, size_t out_bytes) {
  static const char *names[] = {"scalar", "avx2", "avx512"};
  zpp_qcfg_t q;
  size_t i;
  void *out;
  memset(&q, 0, sizeof q);
  q.bits = cfg->bits;
  q.asym = cfg->mode == ZPP_QUANT_ASYMMETRIC;
  q.block = cfg->block_size;
  out = malloc(out_bytes ? out_bytes : 1);
  if (out == NULL)
    return;
  for (i = 0; i < sizeof names / sizeof names[0]; i++) {
    const zpp_quant_cpu_ops_t *ops = zpp_quant_cpu_ops_named(names[i]);
    if (ops == NULL)
      continue;
    if (acc_before != NULL)
      memcpy(out, acc_before, out_bytes);
    ops->decode(&q, src, count, out_kind, out);
    if (memcmp(out, expect, out_bytes) != 0) {
      fprintf(stderr, "fuzz_quant_decode: the %s path differs from %s\n",
              names[i], zpp_quant_cpu_isa());
      abort();
    }
  }
  free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t h[HDR];
  zpp_quant_config_t cfg = ZPP_QUANT_CONFIG_INIT;
  static const size_t sizes[4] = {
      sizeof(zpp_quant_config_t), offsetof(zpp_quant_config_t, rounding), 0,
      offsetof(zpp_quant_config_t, rounding) - 1};
  const uint8_t *payload = data + (size < HDR ? size : HDR);
  size_t plen = size < HDR ? 0 : size - HDR, count, need = 0, esize, i;
  zpp_dtype_t dtype;
  zpp_status_t check, st;
  int op;

  if (n_inputs++ == 0)
    atexit(summary);
  memset(h, 0, sizeof h);
  memcpy(h, data, size < HDR ? size : HDR);
  cfg.struct_size = sizes[h[0] % 4];
  cfg.bits = (int8_t)h[1];
  cfg.block_size = (size_t)le(h + 2, 4) << (h[6] % 64);
  cfg.mode = (zpp_quant_mode_t)(int8_t)h[7];
  cfg.rounding = (zpp_rounding_t)(int8_t)h[8];
  dtype = (zpp_dtype_t)(int8_t)h[9];
  count = (size_t)le(h + 10, 4) << (h[14] % 64);
  op = h[15] % 3;
  cfg.seed = le(h + 16, 8);

  check = zpp_quant_config_check(&cfg);
  if (check != ZPP_OK && zpp_get_last_error()[0] == '\0')
    fail("a rejected config has no message", check);
  st = zpp_quant_encoded_size(&cfg, count, &need);
  if ((check != ZPP_OK) != (st != ZPP_OK) && st != ZPP_ERR_OVERFLOW)
    fail("zpp_quant_encoded_size disagrees with zpp_quant_config_check", st);

  esize = op == 1 ? sizeof(float) : zpp_dtype_size(dtype);
  if (op == 2) { /* encode the payload's elements */
    size_t n = esize ? plen / esize : 0;
    uint8_t *dst;
    if (n > count)
      n = count;
    if (st != ZPP_OK || zpp_quant_encoded_size(&cfg, n, &need) != ZPP_OK)
      need = 0;
    dst = malloc(need ? need : 1);
    if (dst == NULL)
      return 0;
    st = zpp_quant_encode(&cfg, dtype, payload, n, dst, need);
    if (check != ZPP_OK && st == ZPP_OK)
      fail("zpp_quant_encode accepted a rejected config", st);
    if (st == ZPP_OK && n > 0) { /* and decode it back through every path */
      n_accepted++;
      float *back = malloc(n * sizeof(float));
      if (back != NULL) {
        st = zpp_quant_decode(&cfg, dst, need, n, ZPP_FLOAT32, back);
        if (st != ZPP_OK)
          fail("decoding what zpp_quant_encode wrote failed", st);
        compare_paths(&cfg, dst, n, ZPP_FLOAT32, back, NULL,
                      n * sizeof(float));
        free(back);
      }
    }
    free(dst);
    return 0;
  }

  {
    /* Outputs of exactly count elements, or a token buffer when count
     * cannot fit the payload (the call must then fail). */
    int fits = esize != 0 && count <= MAX_OUT_ELEMS && count <= 2 * plen + 2;
    size_t out_bytes = fits ? count * esize : 16;
    uint8_t *out = malloc(out_bytes ? out_bytes : 1), *acc0 = NULL;
    if (out == NULL)
      return 0;
    for (i = 0; i < out_bytes; i++) /* finite accumulator values */
      out[i] = (uint8_t)(i % 4 == 3 ? 0x3f : i * 37u);
    if (op == 1) {
      acc0 = malloc(out_bytes ? out_bytes : 1);
      if (acc0 != NULL)
        memcpy(acc0, out, out_bytes);
      st = zpp_quant_decode_accumulate(&cfg, payload, plen, count,
                                       (float *)out);
    } else {
      st = zpp_quant_decode(&cfg, payload, plen, count, dtype, out);
    }
    if (check != ZPP_OK && st == ZPP_OK)
      fail("decode accepted a config that zpp_quant_config_check rejects",
           st);
    if (st != ZPP_OK && zpp_get_last_error()[0] == '\0')
      fail("decode failed without a message", st);
    if (st == ZPP_OK && !fits && count > 0)
      fail("decode accepted more elements than the payload holds", st);
    if (st == ZPP_OK && count > 0) {
      n_accepted++;
      if (need > plen)
        fail("decode accepted a payload shorter than the encoded size", st);
      compare_paths(&cfg, payload, count,
                    op == 1 ? ZPP_QM_OUT_ACC : (int)dtype, out, acc0,
                    out_bytes);
    }
    free(acc0);
    free(out);
  }
  return 0;
}
