/*
 * Per-element and per-block quantization math shared by the CPU (scalar and
 * SIMD) and CUDA code paths.  Everything here is `static inline` and marked
 * for host and device so that the paths cannot drift apart.
 *
 * The rules implemented here are specified in docs/format.md; every
 * arithmetic step is a single IEEE-754 binary32 operation rounded to
 * nearest-even, with no fused multiply-add (build flags forbid contraction:
 * -ffp-contract=off for C, --fmad=false for CUDA).
 *
 * Invariant: a function here never produces a code outside the documented
 * range, whatever its input.
 */
#ifndef ZPP_KERNELS_QUANT_MATH_H
#define ZPP_KERNELS_QUANT_MATH_H

#include <stddef.h>
#include <stdint.h>
#if !defined(__CUDACC__)
#include <string.h>
#endif

#if defined(ZPP_QM_DEVICE_CODE) && defined(__cplusplus)
#include <cuda_runtime.h> /* the emulator's: ZPP_CUDA_EMU, zpp_emu_misaligned */
#endif

#if defined(__CUDACC__)
#define ZPP_QM_HD __host__ __device__ __forceinline__
#else
#define ZPP_QM_HD inline
#endif

/* dtype ids: the same values as zpp_dtype_t in <zpp/zpp.h>. */
enum { ZPP_QM_F32 = 0, ZPP_QM_F16 = 1, ZPP_QM_BF16 = 2 };

/* Bytes of one element of a dtype id. */
static ZPP_QM_HD size_t zpp_qm_dtype_bytes(int dtype) {
  return dtype == ZPP_QM_F32 ? 4 : 2;
}

/* How a block is encoded (docs/format.md, "Block parameters"). */
enum {
  ZPP_QM_KIND_MUL = 0,      /* q = rint(clamp(v * inv))                    */
  ZPP_QM_KIND_DIV = 1,      /* q = rint(clamp(v / scale)): inv overflowed  */
  ZPP_QM_KIND_CONST = 2,    /* every code 0 (all-zero or constant block)   */
  ZPP_QM_KIND_NONFINITE = 3 /* every code 0, scale (and zero) NaN          */
};

#define ZPP_QM_ABS_MASK 0x7fffffffu
#define ZPP_QM_EXP_MASK 0x7f800000u /* |x| bits >= this: Inf or NaN */
#define ZPP_QM_QNAN_BITS 0x7fc00000u
#define ZPP_QM_MIN_SUBNORMAL_BITS 0x00000001u /* 2^-149 */

typedef struct {
  float scale; /* stored in the block's metadata */
  float zero;  /* asymmetric only: the block minimum, stored after scale */
  float inv;   /* levels / range, used when kind == ZPP_QM_KIND_MUL */
  float lo, hi; /* clamp bounds of the scaled value, as floats */
  int kind;
} zpp_qm_params_t;

/* ---- bit casts --------------------------------------------------------- */

static ZPP_QM_HD uint32_t zpp_qm_f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
#endif
}

static ZPP_QM_HD float zpp_qm_bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

/* ---- dtype conversions (exact to fp32; RNE from fp32) -------------------- */

static ZPP_QM_HD float zpp_qm_bf16_to_f32(uint16_t h) {
  return zpp_qm_bits_f32((uint32_t)h << 16);
}

/* Round to nearest even; NaN stays NaN (quietened, sign and top payload
 * kept); overflow rounds to Inf as IEEE requires. */
static ZPP_QM_HD uint16_t zpp_qm_f32_to_bf16(float f) {
  uint32_t u = zpp_qm_f32_bits(f);
  if ((u & ZPP_QM_ABS_MASK) > ZPP_QM_EXP_MASK)
    return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static ZPP_QM_HD float zpp_qm_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {
    /* subnormal half: normalise the mantissa */
    uint32_t e = 113u;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      e--;
    }
    u = sign | (e << 23) | ((man & 0x3ffu) << 13);
  }
  return zpp_qm_bits_f32(u);
}

/* Round to nearest even, as the F16C instruction vcvtps2ph with imm 0
 * does, including subnormal results and NaN quietening. */
static ZPP_QM_HD uint16_t zpp_qm_f32_to_f16(float f) {
  uint32_t u = zpp_qm_f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & ZPP_QM_ABS_MASK;
  if (a > ZPP_QM_EXP_MASK) /* NaN */
    return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) /* rounds to >= 65520: Inf */
    return (uint16_t)(sign | 0x7c00u);
  if (a >= 0x38800000u) { /* normal half: |f| >= 2^-14 */
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
    return (uint16_t)(sign | (r >> 13));
  }
  if (a < 0x33000001u) /* |f| <= 2^-25: rounds to zero */
    return sign;
  {
    /* subnormal half: value = m * 2^-24 with m = a's significand shifted */
    uint32_t e = a >> 23;
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* in [14, 24] */
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u)))
      q++;
    return (uint16_t)(sign | q);
  }
}

/* Device code compiled as C++ for the CPU emulator (tests/cuda_emu: its
 * cuda_runtime.h defines ZPP_CUDA_EMU; the kernel sources define
 * ZPP_QM_DEVICE_CODE before their includes) checks that each element
 * zpp_qm_load and zpp_qm_store access is naturally aligned, as the one
 * plain access of the GPU requires, and faults there as the GPU does
 * (zpp_emu_misaligned: a sticky cudaErrorMisalignedAddress).  Host code
 * copies bytes and checks nothing. */
#if !defined(__CUDA_ARCH__) && defined(ZPP_CUDA_EMU) &&                        \
    defined(ZPP_QM_DEVICE_CODE)
#define ZPP_QM_EMU_CHECK_ALIGNED(q, n, op)                                     \
  do {                                                                         \
    if ((uintptr_t)(q) % (n) != 0)                                             \
      zpp_emu_misaligned((q), (n), (op));                                      \
  } while (0)
#else
#define ZPP_QM_EMU_CHECK_ALIGNED(q, n, op) ((void)0)
#endif

/* Element i of a buffer of `dtype`.  Host code copies bytes, so buffers of
 * any alignment are accepted.  Device code makes one plain access of the
 * element's size, which a GPU refuses (cudaErrorMisalignedAddress) unless
 * the element is naturally aligned: a caller whose buffer may start at any
 * byte (a bf16 buffer at an odd address) uses the element-wise accessors of
 * launch.cuh, which take any alignment, or a byte path of its own. */
static ZPP_QM_HD float zpp_qm_load(const void *p, size_t i, int dtype) {
#if defined(__CUDA_ARCH__)
  if (dtype == ZPP_QM_F32)
    return ((const float *)p)[i];
  if (dtype == ZPP_QM_BF16)
    return zpp_qm_bf16_to_f32(((const uint16_t *)p)[i]);
  return zpp_qm_f16_to_f32(((const uint16_t *)p)[i]);
#else
  if (dtype == ZPP_QM_F32) {
    float f;
    ZPP_QM_EMU_CHECK_ALIGNED((const char *)p + 4 * i, 4, "zpp_qm_load");
    memcpy(&f, (const char *)p + 4 * i, 4);
    return f;
  } else {
    uint16_t h;
    ZPP_QM_EMU_CHECK_ALIGNED((const char *)p + 2 * i, 2, "zpp_qm_load");
    memcpy(&h, (const char *)p + 2 * i, 2);
    return dtype == ZPP_QM_BF16 ? zpp_qm_bf16_to_f32(h) : zpp_qm_f16_to_f32(h);
  }
#endif
}

static ZPP_QM_HD void zpp_qm_store(void *p, size_t i, int dtype, float v) {
#if defined(__CUDA_ARCH__)
  if (dtype == ZPP_QM_F32)
    ((float *)p)[i] = v;
  else if (dtype == ZPP_QM_BF16)
    ((uint16_t *)p)[i] = zpp_qm_f32_to_bf16(v);
  else
    ((uint16_t *)p)[i] = zpp_qm_f32_to_f16(v);
#else
  if (dtype == ZPP_QM_F32) {
    ZPP_QM_EMU_CHECK_ALIGNED((char *)p + 4 * i, 4, "zpp_qm_store");
    memcpy((char *)p + 4 * i, &v, 4);
  } else {
    uint16_t h =
        dtype == ZPP_QM_BF16 ? zpp_qm_f32_to_bf16(v) : zpp_qm_f32_to_f16(v);
    ZPP_QM_EMU_CHECK_ALIGNED((char *)p + 2 * i, 2, "zpp_qm_store");
    memcpy((char *)p + 2 * i, &h, 2);
  }
#endif
}

/* ---- format geometry ---------------------------------------------------- */

/* Largest code of a symmetric width (127 or 7) and number of steps of an
 * asymmetric one (255 or 15). */
static ZPP_QM_HD int zpp_qm_sym_qmax(int bits) { return (1 << (bits - 1)) - 1; }
static ZPP_QM_HD int zpp_qm_asym_levels(int bits) { return (1 << bits) - 1; }

/* Bytes of metadata per block: fp32 scale, plus fp32 zero if asymmetric. */
static ZPP_QM_HD size_t zpp_qm_meta_bytes(int asym) { return asym ? 8u : 4u; }

/* Payload bytes of a block of `len` elements: every block starts on a byte
 * boundary, so blocks can be encoded independently. */
static ZPP_QM_HD size_t zpp_qm_payload_bytes(size_t len, int bits) {
  return bits == 8 ? len : (len + 1u) / 2u;
}

/* ---- scalar rounding ---------------------------------------------------- */

/* Round half to even of a float already clamped to |v| <= 255.  Adding and
 * subtracting 1.5 * 2^23 rounds to an integer in the current (default,
 * nearest-even) mode; the two operations cannot be contracted. */
static ZPP_QM_HD float zpp_qm_rint_small(float v) {
#if defined(__CUDA_ARCH__)
  return rintf(v);
#else
  const float magic = 12582912.0f; /* 1.5 * 2^23 */
  float t = v + magic;
  return t - magic;
#endif
}

/* ---- block parameters --------------------------------------------------- */

/* Symmetric: from the largest |x| of the block, as raw fp32 bits (an
 * integer max over (bits & 0x7fffffff) is exact, order-free, and puts
 * Inf and NaN above every finite value). */
static ZPP_QM_HD zpp_qm_params_t zpp_qm_sym_params(uint32_t absmax_bits,
                                                   int bits) {
  zpp_qm_params_t p;
  float qmax = (float)zpp_qm_sym_qmax(bits);
  p.zero = 0.0f;
  p.lo = -qmax;
  p.hi = qmax;
  p.inv = 0.0f;
  if (absmax_bits >= ZPP_QM_EXP_MASK) {
    p.kind = ZPP_QM_KIND_NONFINITE;
    p.scale = zpp_qm_bits_f32(ZPP_QM_QNAN_BITS);
    return p;
  }
  if (absmax_bits == 0) {
    p.kind = ZPP_QM_KIND_CONST;
    p.scale = 0.0f;
    return p;
  }
  {
    float absmax = zpp_qm_bits_f32(absmax_bits);
    p.scale = absmax / qmax;
    if (p.scale == 0.0f) /* underflow: the block is exact at 2^-149 */
      p.scale = zpp_qm_bits_f32(ZPP_QM_MIN_SUBNORMAL_BITS);
    p.inv = qmax / absmax;
    p.kind = (zpp_qm_f32_bits(p.inv) & ZPP_QM_ABS_MASK) >= ZPP_QM_EXP_MASK
                 ? ZPP_QM_KIND_DIV
                 : ZPP_QM_KIND_MUL;
  }
  return p;
}

/* Asymmetric: from the block minimum and maximum (finite; +0 stands for
 * both zeros) and whether the block holds a non-finite value. */
static ZPP_QM_HD zpp_qm_params_t zpp_qm_asym_params(float mn, float mx,
                                                    int nonfinite, int bits) {
  zpp_qm_params_t p;
  float levels = (float)zpp_qm_asym_levels(bits);
  float range;
  p.lo = 0.0f;
  p.hi = levels;
  p.inv = 0.0f;
  mn = mn + 0.0f; /* -0 becomes +0, so both paths store the same zero */
  range = nonfinite ? 0.0f : mx - mn;
  if (nonfinite ||
      (zpp_qm_f32_bits(range) & ZPP_QM_ABS_MASK) >= ZPP_QM_EXP_MASK) {
    /* non-finite input, or a range beyond FLT_MAX (docs/format.md) */
    p.kind = ZPP_QM_KIND_NONFINITE;
    p.scale = zpp_qm_bits_f32(ZPP_QM_QNAN_BITS);
    p.zero = p.scale;
    return p;
  }
  p.zero = mn;
  if (range == 0.0f) {
    p.kind = ZPP_QM_KIND_CONST;
    p.scale = 0.0f;
    return p;
  }
  p.scale = range / levels;
  if (p.scale == 0.0f)
    p.scale = zpp_qm_bits_f32(ZPP_QM_MIN_SUBNORMAL_BITS);
  p.inv = levels / range;
  p.kind = (zpp_qm_f32_bits(p.inv) & ZPP_QM_ABS_MASK) >= ZPP_QM_EXP_MASK
               ? ZPP_QM_KIND_DIV
               : ZPP_QM_KIND_MUL;
  return p;
}

/* ---- per element -------------------------------------------------------- */

/* Code of one finite element; the caller turns it into the stored bits
 * (two's complement for symmetric, unsigned for asymmetric). */
static ZPP_QM_HD int zpp_qm_quantize(float x, const zpp_qm_params_t *p) {
  float v;
  if (p->kind >= ZPP_QM_KIND_CONST)
    return 0;
  v = x - p->zero; /* exact for symmetric (zero is +0) */
  v = p->kind == ZPP_QM_KIND_MUL ? v * p->inv : v / p->scale;
  v = v < p->lo ? p->lo : (v > p->hi ? p->hi : v);
  return (int)zpp_qm_rint_small(v);
}

/* Decoded value of a code: zero + q * scale, two roundings (the device
 * intrinsics are never fused into an FMA). */
static ZPP_QM_HD float zpp_qm_dequantize(int q, float scale, float zero) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(zero, __fmul_rn((float)q, scale));
#else
  float prod = (float)q * scale;
  return zero + prod;
#endif
}

/* acc + v as one rounding; decode-accumulate adds the decoded value. */
static ZPP_QM_HD float zpp_qm_add(float acc, float v) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(acc, v);
#else
  return acc + v;
#endif
}

/* Error feedback with a moving average (LoCo; docs/collectives.md): the new
 * residual of an element whose compensated value x was decoded as dec,
 *   e_new = fl(fl(beta * e) + fl(omega * fl(x - dec))),  omega = fl(1 - beta),
 * four roundings, no FMA; a non-finite result stores 0 (as plain error
 * feedback does), so a skipped step does not poison the next one. */
static ZPP_QM_HD float zpp_qm_ema_residual(float e, float x, float dec,
                                           float beta, float omega) {
  float r;
#if defined(__CUDA_ARCH__)
  r = __fadd_rn(__fmul_rn(beta, e), __fmul_rn(omega, __fsub_rn(x, dec)));
#else
  float d = x - dec, a = beta * e, b = omega * d;
  r = a + b;
#endif
  return (zpp_qm_f32_bits(r) & ZPP_QM_ABS_MASK) >= ZPP_QM_EXP_MASK ? 0.0f : r;
}

/* Stored bits of a code and back.  INT4 lives in a nibble. */
static ZPP_QM_HD uint8_t zpp_qm_code_bits(int q) { return (uint8_t)(q & 0xff); }

static ZPP_QM_HD int zpp_qm_code_value(uint32_t stored, int bits, int asym) {
  if (asym)
    return (int)stored;
  if (bits == 8)
    return (int)(int8_t)(uint8_t)stored;
  return (int)((stored ^ 8u) & 0xfu) - 8;
}

/* ---- stochastic rounding (docs/format.md, "Stochastic rounding") -------- */

/* A bijective 32-bit mixer (two multiply-xorshift rounds).  Only 32-bit
 * integer operations, so the SIMD paths (vpmulld) and CUDA compute the same
 * bits as this scalar code. */
static ZPP_QM_HD uint32_t zpp_qm_mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

/* The two 32-bit keys of a 64-bit seed (the splitmix64 finaliser), computed
 * once per call. */
typedef struct {
  uint32_t k0, k1;
} zpp_qm_keys_t;

static ZPP_QM_HD zpp_qm_keys_t zpp_qm_rng_keys(uint64_t seed) {
  zpp_qm_keys_t k;
  uint64_t z = seed + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  k.k0 = (uint32_t)z;
  k.k1 = (uint32_t)(z >> 32);
  return k;
}

/* 24 uniform random bits of element `idx` (counter-based: a pure function
 * of the keys and the index, so any path and any split of the work gives
 * the same bits). */
static ZPP_QM_HD uint32_t zpp_qm_rand24(zpp_qm_keys_t k, uint64_t idx) {
  uint32_t x = zpp_qm_mix32((uint32_t)idx ^ k.k0);
  x = zpp_qm_mix32(x ^ (uint32_t)(idx >> 32) ^ k.k1);
  return x >> 8;
}

/* Largest integer <= v for |v| <= 256: rint, minus one when it rounded up
 * (exact). */
static ZPP_QM_HD float zpp_qm_floor_small(float v) {
#if defined(__CUDA_ARCH__)
  return floorf(v);
#else
  float r = zpp_qm_rint_small(v);
  return r > v ? r - 1.0f : r;
#endif
}

/* Stochastic code of one finite element: with v the clamped scaled value
 * (exactly as zpp_qm_quantize computes it), f = floor(v) and the fraction
 * p = fl(v - f) (exact except for -1/2 < v < 0, where it is v + 1 rounded
 * to the 2^-24 grid: docs/format.md), the code is f + 1 when
 * u = r24 * 2^-24 < p, else f.  So P(f + 1) = ceil(p 2^24) / 2^24:
 * unbiased to within 2^-24 of a step.  v in [lo, hi] keeps the code in
 * range (v = hi has fraction 0). */
static ZPP_QM_HD int zpp_qm_quantize_sr(float x, const zpp_qm_params_t *p,
                                        uint32_t r24) {
  float v, f, u;
  if (p->kind >= ZPP_QM_KIND_CONST)
    return 0;
  v = x - p->zero;
  v = p->kind == ZPP_QM_KIND_MUL ? v * p->inv : v / p->scale;
  v = v < p->lo ? p->lo : (v > p->hi ? p->hi : v);
  f = zpp_qm_floor_small(v);
  u = (float)r24 * 5.9604644775390625e-08f; /* 2^-24: exact */
  return (int)f + (u < v - f ? 1 : 0);
}

/* ---- compressed-domain sums (qgZ sum INT; docs/format.md, "Integer
 * sums") ----------------------------------------------------------------
 * Per block, the ranks of a stage agree on a power-of-two unit 2^E (E the
 * max of their exponents); rank r quantizes with the step m_r 2^E, m_r an
 * integer multiplier in [1, 255] close to its own absmax / qmax, so that
 * m_r q is an exact integer number of units and the stage's sums are
 * integers. */

/* Exponent byte of a block: all zero (no unit), non-finite (the block
 * decodes to NaN), or E in [ZPP_QM_UEXP_MIN, 118] (the largest finite
 * absmax, just below 2^128, gives s < 2^128 / 7 <= 255 2^118). */
#define ZPP_QM_UEXP_ZERO (-128)
#define ZPP_QM_UEXP_NONFINITE 127
#define ZPP_QM_UEXP_MIN (-126)
#define ZPP_QM_UMULT_MAX 255

/* 2^e as fp32, e in [-126, 127] (a normal number, built from its bits). */
static ZPP_QM_HD float zpp_qm_pow2(int e) {
  return zpp_qm_bits_f32((uint32_t)(e + 127) << 23);
}

/* A rank's exponent of a block from its own absmax bits: the smallest
 * e >= ZPP_QM_UEXP_MIN with s <= 255 2^e, s = fl(absmax / qmax) (the
 * scale of zpp_qm_sym_params; 2^-149 when that underflows).  With
 * s = f 2^k, f in [0.5, 1) (frexp): e = k - 8, or k - 7 when f > 255/256. */
static ZPP_QM_HD int zpp_qm_unit_exp(uint32_t absmax_bits, int bits) {
  zpp_qm_params_t p;
  uint32_t sb;
  int k, e;
  if (absmax_bits >= ZPP_QM_EXP_MASK)
    return ZPP_QM_UEXP_NONFINITE;
  if (absmax_bits == 0)
    return ZPP_QM_UEXP_ZERO;
  p = zpp_qm_sym_params(absmax_bits, bits);
  sb = zpp_qm_f32_bits(p.scale);
  if (sb < 0x00800000u) /* subnormal s <= 2^-126 <= 255 2^-126 */
    return ZPP_QM_UEXP_MIN;
  /* s = 1.m 2^(x - 127) = f 2^k with f = 1.m / 2, k = x - 126; f > 255/256
   * iff 1.m > 255/128, the top 7 mantissa bits all set and some below */
  k = (int)(sb >> 23) - 126;
  e = k - 8 + ((sb & 0x7fffffu) > 0x7f0000u ? 1 : 0);
  return e < ZPP_QM_UEXP_MIN ? ZPP_QM_UEXP_MIN : e;
}

/* Rank's multiplier of a block with agreed exponent E (its own exponent
 * <= E): max(ceil(s 2^-E), 1), s as above, so that the step m 2^E is at
 * least s and no code clamps; 0 for an all-zero or non-finite block.
 * s 2^-E <= 255 (s <= 255 2^E) is exact, or below 2^-126 (then m = 1). */
static ZPP_QM_HD uint32_t zpp_qm_unit_mult(uint32_t absmax_bits, int bits,
                                           int e) {
  float v;
  if (absmax_bits == 0 || absmax_bits >= ZPP_QM_EXP_MASK ||
      e == ZPP_QM_UEXP_NONFINITE || e == ZPP_QM_UEXP_ZERO)
    return 0;
  v = -zpp_qm_floor_small(
      -(zpp_qm_sym_params(absmax_bits, bits).scale * zpp_qm_pow2(-e)));
  return v < 1.0f ? 1u : (v > 255.0f ? 255u : (uint32_t)v);
}

/* The value of the unit of exponent byte e: 2^e; 0 for an all-zero
 * block; NaN for a non-finite one. */
static ZPP_QM_HD float zpp_qm_unit_value(int e) {
  if (e == ZPP_QM_UEXP_NONFINITE)
    return zpp_qm_bits_f32(ZPP_QM_QNAN_BITS);
  return e == ZPP_QM_UEXP_ZERO ? 0.0f : zpp_qm_pow2(e);
}

/* Quantizer parameters of a step m 2^e (zpp_qm_quantize and _sr apply):
 * scale m 2^e (exact), inv fl(fl(1 / m) 2^-e), codes in [-qmax, qmax];
 * m = 0: every code 0 (CONST; NONFINITE for e non-finite). */
static ZPP_QM_HD zpp_qm_params_t zpp_qm_unit_params(int e, uint32_t m,
                                                    int bits) {
  zpp_qm_params_t p;
  float qmax = (float)zpp_qm_sym_qmax(bits);
  p.zero = 0.0f;
  p.lo = -qmax;
  p.hi = qmax;
  p.inv = 0.0f;
  p.scale = 0.0f;
  if (e == ZPP_QM_UEXP_NONFINITE) {
    p.kind = ZPP_QM_KIND_NONFINITE;
    p.scale = zpp_qm_bits_f32(ZPP_QM_QNAN_BITS);
    return p;
  }
  if (m == 0 || e == ZPP_QM_UEXP_ZERO) {
    p.kind = ZPP_QM_KIND_CONST;
    return p;
  }
  p.kind = ZPP_QM_KIND_MUL;
  p.scale = (float)m * zpp_qm_pow2(e);
  p.inv = (1.0f / (float)m) * zpp_qm_pow2(-e); /* e in [-126, 118] */
  return p;
}

/* The multipliers (into mult) and quantizer parameters of blocks [b0,
 * min(b0 + ZPP_QM_UNIT_GROUP, nb)), the formulas above one block after
 * another: in the SIMD encodes their divisions then wait neither on each
 * other nor on the vector work of the blocks before, as they do computed
 * block by block (host code). */
#define ZPP_QM_UNIT_GROUP 32
static inline void zpp_qm_unit_group(int bits, const uint32_t *amax,
                                     const int8_t *uexp, size_t b0, size_t nb,
                                     uint8_t *mult, zpp_qm_params_t *pg) {
  size_t b, b1 = nb - b0 < ZPP_QM_UNIT_GROUP ? nb : b0 + ZPP_QM_UNIT_GROUP;
  for (b = b0; b < b1; b++) {
    uint32_t m = zpp_qm_unit_mult(amax[b], bits, uexp[b]);
    mult[b] = (uint8_t)m;
    pg[b - b0] = zpp_qm_unit_params(uexp[b], m, bits);
  }
}

/* A rank's own (unsent) value in units of 2^e: rint(fl(x 2^-e)), exact
 * scaling; |x| <= its absmax bounds it by 255 qmax + 1.  0 for an
 * all-zero or non-finite block. */
static ZPP_QM_HD int32_t zpp_qm_unit_own(float x, int e) {
  if (e == ZPP_QM_UEXP_NONFINITE || e == ZPP_QM_UEXP_ZERO)
    return 0;
  return (int32_t)zpp_qm_rint_small(x * zpp_qm_pow2(-e));
}

/* Largest integer sum magnitude the kernels take: every conversion of a
 * sum (plus a compensated residual, clamped to the same) to fp32 is exact
 * below 2^24.  A stage of S ranks at qmax needs S 255 (qmax + 1) <= it. */
#define ZPP_QM_ISUM_MAX 4194304 /* 2^22 */

/* The integer divisor of a block whose integer sums have largest
 * magnitude m, for codes of at most qmax: ceil(m / qmax), 1 for m = 0. */
static ZPP_QM_HD uint32_t zpp_qm_idivisor(uint32_t m, int qmax) {
  return m == 0 ? 1u : (m + (uint32_t)qmax - 1u) / (uint32_t)qmax;
}

/* Re-quantization parameters of integer sums with divisor d and unit
 * 2^e: codes zpp_qm_quantize((float)j, p) (v = fl(j fl(1 / d)), clamped
 * to +-qmax2), decoded with the carried scale fl(d 2^e) (exact). */
static ZPP_QM_HD zpp_qm_params_t zpp_qm_irequant_params(uint32_t d, int e,
                                                        int bits2) {
  zpp_qm_params_t p;
  float qmax = (float)zpp_qm_sym_qmax(bits2);
  p.zero = 0.0f;
  p.lo = -qmax;
  p.hi = qmax;
  p.kind = ZPP_QM_KIND_MUL;
  p.inv = 1.0f / (float)d;
  p.scale = (float)d * zpp_qm_unit_value(e);
  if (e == ZPP_QM_UEXP_NONFINITE)
    p.kind = ZPP_QM_KIND_NONFINITE;
  else if (e == ZPP_QM_UEXP_ZERO)
    p.kind = ZPP_QM_KIND_CONST;
  return p;
}

/* A residual r in units of 2^e, for the compensated sum j = I + it:
 * rint(clamp(r 2^-e, +-2^22)), NaN 0; 0 for an all-zero or non-finite
 * block. */
static ZPP_QM_HD int32_t zpp_qm_unit_res(float r, int e) {
  float v;
  if (e == ZPP_QM_UEXP_NONFINITE || e == ZPP_QM_UEXP_ZERO)
    return 0;
  v = r * zpp_qm_pow2(-e);
  v = v > (float)ZPP_QM_ISUM_MAX ? (float)ZPP_QM_ISUM_MAX : v;
  v = v < -(float)ZPP_QM_ISUM_MAX ? -(float)ZPP_QM_ISUM_MAX : v;
  v = v != v ? 0.0f : v;
  return (int32_t)zpp_qm_rint_small(v);
}

/* Plain error feedback's new residual: fl(x - dec), 0 when not finite. */
static ZPP_QM_HD float zpp_qm_ef_residual(float x, float dec) {
  float r = x - dec;
  return (zpp_qm_f32_bits(r) & ZPP_QM_ABS_MASK) >= ZPP_QM_EXP_MASK ? 0.0f : r;
}

/* Error feedback's new residual of an element whose compensated value x
 * (old residual e) was coded q with step `scale`: the decoded value
 * dec = zpp_qm_dequantize(q, scale, 0), then zpp_qm_ef_residual (beta 0)
 * or zpp_qm_ema_residual (omega = fl(1 - beta)). */
static ZPP_QM_HD float zpp_qm_feedback(float e, float x, int q, float scale,
                                       float beta, float omega) {
  float dec = zpp_qm_dequantize(q, scale, 0.0f);
  return beta == 0.0f ? zpp_qm_ef_residual(x, dec)
                      : zpp_qm_ema_residual(e, x, dec, beta, omega);
}

/* ---- Hadamard rotation (docs/format.md, "Hadamard rotation") ----------- */

/* fl(1 / sqrt(g)) for g = 2^k: 2^(-k/2) exactly for even k; for odd k the
 * binary32 value nearest 1/sqrt(2) (0x3f3504f3) times 2^(-(k-1)/2), an
 * exact power-of-two scaling. */
static ZPP_QM_HD float zpp_qm_hadamard_scale(size_t g) {
  int k = 0;
  float s;
  while (((size_t)1 << k) < g)
    k++;
  s = (k & 1) ? zpp_qm_bits_f32(0x3f3504f3u) : 1.0f;
  return s * zpp_qm_bits_f32((uint32_t)(127 - k / 2) << 23);
}

/* In place, one group of g = 2^k floats: the butterflies of the fast
 * Walsh-Hadamard transform in the order h = 1, 2, 4, ..., g/2 (within a
 * stage the pairs are independent), (a, b) -> (a + b, a - b), then every
 * element times zpp_qm_hadamard_scale(g).  The SIMD and CUDA paths perform
 * exactly these operations on every element, in this stage order. */
static ZPP_QM_HD void zpp_qm_fwht(float *x, size_t g) {
  size_t h, i, j;
  float c = zpp_qm_hadamard_scale(g);
  for (h = 1; h < g; h *= 2)
    for (i = 0; i < g; i += 2 * h)
      for (j = i; j < i + h; j++) {
        float a = x[j], b = x[j + h];
        x[j] = zpp_qm_add(a, b);
        x[j + h] = zpp_qm_add(a, -b);
      }
  for (i = 0; i < g; i++)
    x[i] = x[i] * c;
}

#endif /* ZPP_KERNELS_QUANT_MATH_H */
