#!/usr/bin/env python3
"""Writes the seed corpus of tests/fuzz (corpus/<target>/seed-*): small valid
and near-valid inputs in each target's input format (described at the top
of each fuzz_*.c).  Run once; the output is committed.  Regression inputs
(crashers found later) sit beside the seeds under other names."""
import json
import math
import pathlib
import random
import struct

root = pathlib.Path(__file__).resolve().parent / "corpus"
rng = random.Random(20260511)


def put(target, name, data):
    d = root / target
    d.mkdir(parents=True, exist_ok=True)
    (d / ("seed-" + name)).write_bytes(data)


# ---- fuzz_quant_decode: 24-byte header, then the payload ----------------
def qsize(bits, block, asym, count):
    if count == 0:
        return 0
    nb = (count + block - 1) // block
    tail = count - (nb - 1) * block
    pay = (lambda n: n) if bits == 8 else (lambda n: (n + 1) // 2)
    return nb * (8 if asym else 4) + (nb - 1) * pay(block) + pay(tail)


def qhdr(sel, bits, block, shift, mode, rounding, dtype, count, cshift, op, seed):
    return (bytes([sel, bits & 0xFF]) + struct.pack("<I", block) +
            bytes([shift, mode & 0xFF, rounding & 0xFF, dtype & 0xFF]) +
            struct.pack("<I", count) + bytes([cshift, op]) +
            struct.pack("<Q", seed))


def scales(nb, asym):
    out = b""
    for _ in range(nb):
        out += struct.pack("<f", rng.uniform(1e-3, 2.0))
        if asym:
            out += struct.pack("<f", rng.uniform(-1, 1))
    return out


i = 0
for bits in (8, 4):
    for asym in (0, 1):
        for block, count, dtype, op in ((1, 5, 0, 0), (7, 30, 1, 0),
                                        (64, 200, 2, 1), (256, 257, 0, 0)):
            nb = (count + block - 1) // block
            body = scales(nb, asym)
            body += bytes(rng.randrange(256)
                          for _ in range(qsize(bits, block, asym, count) - len(body)))
            put("fuzz_quant_decode", "dec%02d" % i,
                qhdr(0, bits, block, 0, asym, 0, dtype, count, 0, op, i) + body)
            i += 1
# encode of fp32 / fp16 / bf16 data (with NaN and infinities), both roundings
for dtype, fmt, size in ((0, "<f", 4), (1, "<e", 2)):
    vals = [rng.gauss(0, 1) for _ in range(40)] + [math.inf, -math.inf, math.nan, 0.0, 65504.0]
    data = b"".join(struct.pack(fmt, v) for v in vals)
    for rounding in (0, 1):
        put("fuzz_quant_decode", "enc%d%d" % (dtype, rounding),
            qhdr(0, 4, 16, 0, rounding, rounding, dtype, len(vals), 0, 2, 99) + data)
put("fuzz_quant_decode", "enc_bf16",
    qhdr(0, 8, 5, 0, 1, 0, 2, 20, 0, 2, 1) + bytes(rng.randrange(256) for _ in range(40)))
# rejected configs and sizes: bits 3, block 0, mode 2, dtype 7, old struct
# sizes, a count that does not fit, a block size past the count
put("fuzz_quant_decode", "bad_bits", qhdr(0, 3, 32, 0, 0, 0, 0, 10, 0, 0, 0) + bytes(64))
put("fuzz_quant_decode", "bad_block", qhdr(0, 8, 0, 0, 0, 0, 0, 10, 0, 1, 0) + bytes(64))
put("fuzz_quant_decode", "bad_mode", qhdr(0, 8, 32, 0, 2, 0, 0, 10, 0, 0, 0) + bytes(64))
put("fuzz_quant_decode", "bad_dtype", qhdr(0, 8, 32, 0, 0, 0, 7, 10, 0, 0, 0) + bytes(64))
put("fuzz_quant_decode", "struct_v1", qhdr(1, 8, 32, 0, 0, 9, 0, 10, 0, 0, 0) + bytes(64))
put("fuzz_quant_decode", "struct_0", qhdr(2, 8, 32, 0, 0, 0, 0, 10, 0, 0, 0) + bytes(64))
put("fuzz_quant_decode", "huge_count", qhdr(0, 4, 1, 0, 1, 0, 0, 1, 63, 0, 0) + bytes(64))
put("fuzz_quant_decode", "huge_block", qhdr(0, 4, 3, 62, 0, 0, 1, 9, 0, 0, 0) + bytes(64))
put("fuzz_quant_decode", "short_payload", qhdr(0, 8, 4, 0, 0, 0, 0, 12, 0, 0, 0) + bytes(10))

# ---- fuzz_topo: world-size byte, spec, NUL, hosts/GPUs/links -------------
hosts = b"".join(("node%02d.cluster.example" % k).encode().ljust(64, b"\0") for k in range(8))
for k, (world, spec) in enumerate(((0, "2x4"), (9, "2x4"), (0, "0,0,0,1,1"),
                                   (0, "0,1,0,1"), (0, " 3 x 2 "), (0, "1x1"),
                                   (0, "4X2"), (3, "1x4"), (0, "0,0,1,1,2"),
                                   (0, "0,2"), (0, "x"), (0, "65536x2"),
                                   (0, "0,,1"), (0, "-1,0"))):
    tail = b""
    if k % 2 == 0:
        tail = b"\0" + bytes([k | 1]) + hosts + b'"quoted\\\n\x01' + bytes(range(256))
    put("fuzz_topo", "spec%02d" % k, bytes([world]) + spec.encode() + tail)

# ---- fuzz_settings: records "<selector><value>\n" ------------------------
# selectors below 0xF0 are indices into the settings table (src/core/settings.c
# order, modulo its size: entries appended later keep these meanings);
# 0xF0..0xF5: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_PORT, TORCHELASTIC_RUN_ID,
# then the host name of ZPP_DEBUG_FILE's %h; from 0xF6 (modulo 7):
# SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_NODELIST,
# SLURM_JOB_NODELIST, SLURM_JOB_ID, SLURM_STEP_ID.  Any byte is valid.
NSET = 0xF0
def rec(sel, value):
    return bytes([sel]) + value + b"\n"
put("fuzz_settings", "defaults", b"")
put("fuzz_settings", "log", rec(0, b"TRACE") + rec(1, b"NET,coll") + rec(2, b"/tmp/zpp-%h-%p.log") +
    rec(NSET + 5, b"a-very-long-host-name-of-a-cluster-node.example.internal"))
put("fuzz_settings", "numbers", rec(5, b"1e300") + rec(9, b"nan") + rec(10, b"-5") +
    rec(11, b"99999999999999999999") + rec(12, b"9223372036854775807") + rec(13, b"65") +
    rec(14, b"-1") + rec(16, b"2"))
put("fuzz_settings", "topo_isa", rec(4, b"0,0,1,1") + rec(3, b"avx512") + rec(6, b"ucx"))
put("fuzz_settings", "torchrun", rec(NSET, b"3") + rec(NSET + 1, b"8") + rec(NSET + 2, b"-1") +
    rec(NSET + 3, b"29500") + rec(NSET + 4, b"job|x") + rec(8, b"70000"))
put("fuzz_settings", "ports", rec(NSET + 3, b"65535") + rec(8, b"0") + rec(5, b"inf"))
SLURM = 0xF6
put("fuzz_settings", "slurm", rec(SLURM, b"1") + rec(SLURM + 1, b"4") + rec(SLURM + 2, b"1") +
    rec(SLURM + 3, b"node[01-04,07],gpu3") + rec(SLURM + 4, b"a-[1-2]-b") +
    rec(SLURM + 5, b"4294967295") + rec(SLURM + 6, b"3"))
put("fuzz_settings", "slurm_bad", rec(SLURM, b"7") + rec(SLURM + 1, b"x") +
    rec(SLURM + 3, b"node[3-1") + rec(SLURM + 4, b"n[01-02]x[9],,") + rec(SLURM + 5, b"-1"))

# ---- fuzz_quant_error: selector byte, then the raw file or the arguments --
# (selector: bit 0 command line; bits 1..2 the raw dtype; bits 3..6
# --hadamard, --dtype, --rounding, --decode-to)
f32 = b"".join(struct.pack("<f", rng.gauss(0, 1)) for _ in range(96))
f16 = b"".join(struct.pack("<e", rng.gauss(0, 1)) for _ in range(96))
put("fuzz_quant_error", "raw_fp32", bytes([0]) + f32)
put("fuzz_quant_error", "raw_fp16", bytes([2]) + f16)
put("fuzz_quant_error", "raw_bf16", bytes([4]) + f16)
put("fuzz_quant_error", "raw_fp32_all_flags", bytes([0x78]) + f32)
put("fuzz_quant_error", "raw_fp16_hadamard_bf16", bytes([2 | 8 | 16]) + f16)
put("fuzz_quant_error", "raw_bf16_stochastic_fp32", bytes([4 | 32 | 64]) + f16 + b"\x80\x7f\xc0\x7f")
put("fuzz_quant_error", "raw_odd_size", bytes([2]) + f16[:7])
put("fuzz_quant_error", "args", bytes([1]) + b"\0".join([b"--bits", b"8,4", b"--block=32,0",
    b"--dist", b"normal,laplace", b"--n", b"1000", b"--format", b"csv", b"--hadamard", b"64"]))
put("fuzz_quant_error", "args_bad", bytes([1]) + b"\0".join([b"--outliers", b"99999", b"--n", b"10",
    b"--dist", b"normal-outliers"]))
put("fuzz_quant_error", "args_input", bytes([1]) + b"\0".join([b"--input", b"w.safetensors",
    b"--input-dtype", b"bf16", b"--seed", b"7", b"--rounding", b"stochastic"]))
