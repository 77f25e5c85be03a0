"""perf/gloo_peer.py's checks and perf/gloo_peer_table.py, without a
cluster (perf/gloo_peer_study.sh runs them on one):

- every check of the worker passes the output it defines and fails one
  made wrong: an exact all-gather with one bit flipped; qwZ INT8 outputs
  from zpp.quant (pass) and with their error tripled (fail); the bf16
  reduce-scatter in the documented order computed here with torch's fp32
  and bf16 (pass), with one bit flipped or summed in another order (fail);
  gloo's mean (pass) with one element moved by 1 (fail); qgZ's two
  stages simulated with zpp.quant (pass), one element moved by 100 (fail);
- the reduce-scatter bounds are tight from both sides: a legal but bad
  order (sequential sums sorted by magnitude, gloo in bf16 and fp32, qgZ's
  fp32 stages) passes and uses a fair part of its bound, and every
  element moved to 1.5x and 2x the bound the check computes fails;
- the table from a CSV of random times: every median, paired ratio, link
  bound and wrong count recomputed here, the x bound cells whose bytes
  fit in tbf's burst marked; a CSV with other columns, a row twice or
  link bytes that are not an integer is refused (exit 2);
- the worker's arguments: odd, zero and repeated sizes and a repeated
  collective are refused (exit 2); without FSDP2's divide factors it says
  why, on stderr and in the row;
- the worker itself under mpirun -np 4 (ZPP_TOPO=2x2, loopback, 64 KiB, 2
  repetitions; once more with a tuner file that makes auto choose the
  hierarchical reduce-scatter, whose summation order the check follows):
  every row, none wrong, every element checked, exit 0; and
  under mpirun -np 2 with zpp's all-gather made wrong in one timed call
  of one rank: that row alone is wrong, every row printed, exit 3; a size
  that is no multiple of W elements is refused before any call (exit 2).

Seed: ZPP_TEST_SEED (default 20261207), printed.
"""

import importlib.util
import os
import statistics
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT, env, run_bounded

import zpp

SEED = int(os.environ.get("ZPP_TEST_SEED", "20261207"))
TABLE = ROOT / "perf" / "gloo_peer_table.py"


def _worker():
    spec = importlib.util.spec_from_file_location("gloo_peer", ROOT / "perf" / "gloo_peer.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gp = _worker()


@pytest.fixture
def rng():
    print("seed %d" % SEED)
    return np.random.default_rng(SEED)


def bf16(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float32)).to(torch.bfloat16)


def flip_low_bit(t, i):
    t = t.clone()
    v = t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)
    v[i] ^= 1
    return t


def test_allgather_exact_and_qwz8(rng):
    w, m = 4, 1000  # m: not a multiple of the block, a short last block
    shards = [bf16(rng.standard_normal(m) * 10.0 ** rng.integers(-3, 3)) for _ in range(w)]
    out = torch.cat(shards)
    for variant, o in (("gloo-bf16", out), ("gloo-fp32", out.float())):
        chk = gp.Check()
        gp.check_allgather(variant, o, shards, chk)
        assert (chk.wrong, chk.checked) == (0, w * m)
        chk = gp.Check()
        gp.check_allgather(variant, flip_low_bit(o, 2 * m + 7), shards, chk)
        assert chk.wrong == 1
    q = torch.cat([zpp.quant.decode(zpp.quant.encode(s, bits=8, block=gp.BLOCK), m,
                                    dtype=torch.bfloat16, bits=8, block=gp.BLOCK)
                   for s in shards])
    chk = gp.Check()
    gp.check_allgather("zpp-qwz8", q, shards, chk)
    assert chk.wrong == 0 and chk.max_err > 0
    x = torch.cat(shards).double()
    worse = (x + 3 * (q.double() - x)).to(torch.bfloat16)
    chk = gp.Check()
    gp.check_allgather("zpp-qwz8", worse, shards, chk)
    assert chk.wrong > 0


def documented_rs(parts, node_of, hier):
    """zpp_reduce_scatter's MEAN in bf16 (docs/collectives.md), with torch."""
    w = len(parts)
    acc = None
    for k in (sorted(set(node_of)) if hier else [None]):
        part = None
        for r in range(w):
            if hier and node_of[r] != k:
                continue
            x = parts[r].float()
            part = x.clone() if part is None else part + x
        if hier:
            part = part.to(torch.bfloat16).float()
        acc = part if acc is None else acc + part
    return (acc / torch.tensor(float(w))).to(torch.bfloat16)


@pytest.mark.parametrize("hier", [True, False])
def test_rs_bf16_documented_order(rng, hier):
    node_of, m = [0, 0, 1, 1], 4096
    parts = [bf16(rng.standard_normal(m)) for _ in node_of]
    xs32 = [p.float().numpy() for p in parts]
    out = documented_rs(parts, node_of, hier)
    chk = gp.Check()
    gp.check_rs_zpp_bf16(out, xs32, node_of, hier, chk)
    assert (chk.wrong, chk.checked) == (0, m)
    chk = gp.Check()
    gp.check_rs_zpp_bf16(flip_low_bit(out, 99), xs32, node_of, hier, chk)
    assert chk.wrong == 1
    chk = gp.Check()  # the other order: differs somewhere in 4096 elements
    gp.check_rs_zpp_bf16(documented_rs(parts, node_of, not hier), xs32, node_of, hier, chk)
    assert chk.wrong > 0


@pytest.mark.parametrize("fp32", [True, False])
def test_rs_gloo_bound(rng, fp32):
    w, m = 4, 3000
    parts = [bf16(rng.standard_normal(m)) for _ in range(w)]
    xs = [p.double().numpy() for p in parts]
    mean = torch.from_numpy(sum(xs) / w).to(torch.float32 if fp32 else torch.bfloat16)
    chk = gp.Check()
    gp.check_rs_gloo(mean, xs, 1, False, fp32, chk)
    assert (chk.wrong, chk.checked) == (0, m)
    bad = mean.clone()
    bad[17] += 1.0
    chk = gp.Check()
    gp.check_rs_gloo(bad, xs, 1, False, fp32, chk)
    assert chk.wrong == 1


def test_rs_qgz_two_stage_bound(rng):
    """qgZ's two stages simulated with zpp.quant on 2 nodes x 2: my
    (rank 0's) slice; stage 1 quantizes the ranks of the other local rank,
    stage 2 the other node's fp32 partial."""
    node_of, me, m = [0, 0, 1, 1], 0, 2000
    parts = [bf16(rng.standard_normal(m) * 10.0 ** rng.integers(-2, 2)) for _ in node_of]
    xs = [p.double().numpy() for p in parts]

    def q4(t):
        return zpp.quant.decode(zpp.quant.encode(t, bits=4, block=gp.BLOCK), t.numel(),
                                bits=4, block=gp.BLOCK)

    local = [0, 1, 0, 1]
    stage1 = [q4(p) if local[r] != local[me] else p.float() for r, p in enumerate(parts)]
    p0 = stage1[0] + stage1[1]
    p1 = q4(stage1[2] + stage1[3])
    out = ((p0 + p1) / torch.tensor(4.0)).to(torch.bfloat16)
    chk = gp.Check()
    gp.check_rs_qgz(out, xs, node_of, me, 4, 4, chk)
    assert chk.wrong == 0 and chk.max_err > 0
    out[5] += 100.0  # (inputs up to 10x normal: INT4 bounds of several units)
    chk = gp.Check()
    gp.check_rs_qgz(out, xs, node_of, me, 4, 4, chk)
    assert chk.wrong == 1


def cells_of(md):
    rows = {}
    block = None
    for line in md.splitlines():
        if line.startswith("#### "):
            block = line.split()[1]
        if line.startswith("| ") and ("KiB" in line or "MiB" in line):
            c = [x.strip() for x in line.strip().strip("|").split("|")]
            rows[(block, c[0], c[1], c[2])] = c[3:]
    return rows


def test_table_from_random_csv(rng, tmp_path):
    blocks = [("2x2", "1600mbit", 2), ("2x4", "none", 2)]
    sizes = [(65536, "64 KiB"), (4 << 20, "4 MiB")]
    variants = {"allgather": ["gloo-bf16", "zpp-bf16", "gloo-fp32", "zpp-qwz8"],
                "reducescatter": ["gloo-bf16", "zpp-bf16", "gloo-fp32", "zpp-qgz4"]}
    reps = 5
    t, link, wrong = {}, {}, {}
    lines = [gp.HEADER]
    for layout, rate, nodes in blocks:
        w = 2 * int(layout[2:])
        for size, _ in sizes:
            for coll, vs in variants.items():
                for v in vs:  # zpp's link bytes: one count per variant and size
                    link[(layout, size, coll, v)] = ("" if v.startswith("gloo")
                                                     else str(int(rng.integers(1, 1 << 24))))
                for rep in range(1, reps + 1):
                    for v in vs:
                        us = float("%.1f" % rng.uniform(500, 90000))
                        key = (layout, size, coll, v)
                        t.setdefault(key, {})[rep] = us
                        bad = int(rep == 3 and v == "zpp-qgz4" and size == 65536)
                        wrong[key] = wrong.get(key, 0) + bad
                        lines.append(",".join(map(str, (
                            layout, rate, coll, v, "impl", "call x=1",
                            "fp32" if v.endswith("fp32") else "bf16", size, size // 2, w,
                            nodes, rep, us, bad, 10, 0.5, link[key]))))
    src = tmp_path / "in.csv"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.md"
    subprocess.run([sys.executable, str(TABLE), str(src), str(out)], check=True)
    got = cells_of(out.read_text())
    assert len(got) == len(blocks) * len(sizes) * 8
    rates = {"1600mbit": 1.6e9, "none": None}
    for layout, rate, nodes in blocks:
        for size, name in sizes:
            for coll, vs in variants.items():
                for v in vs:
                    key = (layout, size, coll, v)
                    c = got[(layout, name, coll, v)]
                    med = statistics.median(t[key].values()) / 1e3
                    assert float(c[0]) == pytest.approx(med, rel=6e-3), (key, c)
                    for i, ref in ((2, "gloo-bf16"), (3, "gloo-fp32")):
                        if v == ref:
                            assert c[i] == "-"
                            continue
                        base = t[(layout, size, coll, ref)]
                        ratio = statistics.median(t[key][k] / base[k] for k in base)
                        assert float(c[i]) == pytest.approx(ratio, abs=0.0051), (key, i, c)
                    if rates[rate] is None:
                        assert c[4:6] == ["-", "-"]
                    else:
                        nbytes = (size // 2) * (nodes - 1) / nodes * (4 if v.endswith("fp32")
                                                                      else 2)
                        b = nbytes * 8 / rates[rate] * 1e3
                        assert float(c[4]) == pytest.approx(b, rel=6e-3), (key, c)
                        # inside tbf's burst (72 KiB) the bound does not bind: marked
                        star = "*" if nbytes <= 73728 else ""
                        assert c[5].endswith("*") == bool(star), (key, c)
                        assert float(c[5].rstrip("*")) == pytest.approx(med / b, abs=0.0051,
                                                                        rel=3e-3)
                    if v.startswith("gloo"):
                        assert c[6] == "-"
                    else:
                        assert float(c[6]) == pytest.approx(int(link[key]) / 1e6, abs=0.0051)
                    assert int(c[7]) == wrong[key]
    text = out.read_text()
    assert "fit in tbf's burst (73728 bytes)" in text
    src.write_text("layout,rate,coll\n2x2,none,allgather\n")
    p = subprocess.run([sys.executable, str(TABLE), str(src), str(out)], capture_output=True,
                       text=True)
    assert p.returncode == 2 and "columns" in p.stderr
    # a row twice (the same block, size, collective, variant and rep)
    src.write_text("\n".join(lines + [lines[5]]) + "\n")
    p = subprocess.run([sys.executable, str(TABLE), str(src), str(out)], capture_output=True,
                       text=True)
    assert p.returncode == 2 and "a second time" in p.stderr, (p.returncode, p.stderr)
    # link bytes that are not an integer
    i = next(k for k, l in enumerate(lines) if ",zpp-bf16," in l)
    bad = lines[i].rsplit(",", 1)[0] + ",12.5"
    src.write_text("\n".join(lines[:i] + [bad] + lines[i + 1:]) + "\n")
    p = subprocess.run([sys.executable, str(TABLE), str(src), str(out)], capture_output=True,
                       text=True)
    assert p.returncode == 2 and "12.5" in p.stderr, (p.returncode, p.stderr)


def bf16_seq_mean(parts, fp32):
    """A legal but bad order of gloo's mean: per element the inputs summed
    one after another from the largest magnitude down, each addition
    rounded to the dtype (bf16: through fp32, one rounding of the exact
    sum of two bf16 values), then one division by W rounded to the dtype."""
    w = len(parts)
    x = torch.stack([p.float() for p in parts])  # [W, m]
    order = torch.argsort(x.abs(), dim=0, descending=True)
    x = torch.gather(x, 0, order)
    dt = torch.float32 if fp32 else torch.bfloat16
    acc = x[0].to(dt)
    for r in range(1, w):
        acc = (acc.float() + x[r]).to(dt)  # exact in fp32 for bf16 operands
    return (acc.float() / w).to(dt) if not fp32 else acc / torch.tensor(float(w))


@pytest.mark.parametrize("fp32", [True, False])
def test_rs_gloo_bound_tight(rng, fp32):
    """The bound admits a sequential sum sorted by magnitude (a legal
    order of gloo's reduction) and refuses every element moved to 1.5x and
    2x the bound the check computes."""
    w, m = 12, 3000  # (not a power of 2: the division rounds)
    parts = [bf16(rng.standard_normal(m) * 10.0 ** rng.integers(-2, 3)) for _ in range(w)]
    xs = [p.double().numpy() for p in parts]
    out = bf16_seq_mean(parts, fp32)
    chk = gp.Check()
    gp.check_rs_gloo(out, xs, 1, False, fp32, chk)
    assert (chk.wrong, chk.checked) == (0, m)
    ref, bound = gp.rs_gloo_bound(out.double().numpy(), xs, 1, False, fp32)
    used = float(np.max(np.abs(out.double().numpy() - ref) / bound))
    print("sequential sorted sum: largest error %.3f of the bound" % used)
    assert used > 0.05  # (the bound is not loose by orders of magnitude)
    sign = np.where(rng.integers(0, 2, m) == 1, 1.0, -1.0)
    for k in (1.5, 2.0):
        moved = torch.from_numpy(ref + sign * k * bound).to(out.dtype)
        chk = gp.Check()
        gp.check_rs_gloo(moved, xs, 1, False, fp32, chk)
        assert chk.wrong == m, (k, chk.wrong)


def test_rs_qgz_bound_tight(rng):
    """qgZ's two stages simulated with zpp.quant, each fp32 accumulation
    in a legal but bad order (per element from the largest magnitude
    down), the result rounded to bf16: within the check's bound; every
    element moved to 1.5x and 2x that bound is refused."""
    node_of, me, m = [0, 0, 0, 0, 1, 1, 1, 1], 1, 2000
    w = len(node_of)
    parts = [bf16(rng.standard_normal(m) * 10.0 ** rng.integers(-2, 2)) for _ in node_of]
    xs = [p.double().numpy() for p in parts]

    def q4(t):
        return zpp.quant.decode(zpp.quant.encode(t, bits=4, block=gp.BLOCK), t.numel(),
                                bits=4, block=gp.BLOCK)

    def sorted_sum(ts):
        x = torch.stack(ts)
        x = torch.gather(x, 0, torch.argsort(x.abs(), dim=0, descending=True))
        acc = x[0].clone()
        for t in x[1:]:
            acc = acc + t  # fp32
        return acc

    local = [0, 1, 2, 3, 0, 1, 2, 3]
    stage1 = [q4(p) if local[r] != local[me] else p.float() for r, p in enumerate(parts)]
    p0 = sorted_sum(stage1[:4])
    p1 = q4(sorted_sum(stage1[4:]))
    out = (sorted_sum([p1, p0]) / torch.tensor(float(w))).to(torch.bfloat16)
    chk = gp.Check()
    gp.check_rs_qgz(out, xs, node_of, me, 4, 4, chk)
    assert (chk.wrong, chk.checked) == (0, m)
    ref, bound = gp.rs_qgz_bound(out.double().numpy(), xs, node_of, me, 4, 4)
    used = float(np.max(np.abs(out.double().numpy() - ref) / bound))
    print("qgZ, sorted fp32 sums: largest error %.3f of the bound" % used)
    assert used > 0.05
    sign = np.where(rng.integers(0, 2, m) == 1, 1.0, -1.0)
    for k in (1.5, 2.0):
        moved = torch.from_numpy(ref + sign * k * bound).to(torch.bfloat16)
        chk = gp.Check()
        gp.check_rs_qgz(moved, xs, node_of, me, 4, 4, chk)
        assert chk.wrong == m, (k, chk.wrong)


@pytest.mark.parametrize("args, text", [
    (["--sizes", "64K,64K"], "given twice"),
    (["--sizes", "65537"], "even"),
    (["--sizes", "0"], "even"),
    (["--sizes", "64K", "--colls", "allgather,allgather"], "given twice"),
])
def test_worker_refuses(args, text, capsys):
    with pytest.raises(SystemExit) as e:
        gp.parse_args(args)
    assert e.value.code == 2
    assert text in capsys.readouterr().err


def launch(np_, args, topo, tmp_path=None, driver=None, tuner_file=""):
    e = env(ZPP_TOPO=topo, ZPP_TUNER_FILE=tuner_file)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader",
           "--bind-to", "none", "-np", str(np_)]
    for k in ("PYTHONPATH", "ZPP_LIBRARY", "MASTER_ADDR", "MASTER_PORT",
              "OMPI_MCA_mpi_yield_when_idle", "ZPP_TOPO", "ZPP_TUNER_FILE"):
        cmd += ["-x", k]
    prog = driver or ROOT / "perf" / "gloo_peer.py"
    return run_bounded(cmd + [sys.executable, str(prog)] + args, 240, env=e, text=True)


def rows_of(stdout):
    lines = [l for l in stdout.splitlines() if l.count(",") == gp.HEADER.count(",")]
    assert lines and lines[0] == gp.HEADER, stdout
    keys = gp.HEADER.split(",")
    return [dict(zip(keys, l.split(","))) for l in lines[1:]]


# ZPP_ALGO=auto (the default) with a tuner file that makes its choice the
# hierarchical reduce-scatter: the check follows the family the call
# chose, not the communicator's setting ("auto").
@pytest.mark.parametrize("tuner", ["", "force_hier.txt"])
def test_worker_under_mpirun(have_mpirun, tuner):
    reps = 2
    p = launch(4, ["--sizes", "64K", "--reps", str(reps), "--label", "2x2,none", "--header"],
               "2x2", tuner_file=str(ROOT / "tests" / "tuner" / tuner) if tuner else "")
    assert p.returncode == 0, p.stderr[-4000:]
    rows = rows_of(p.stdout)
    w, n = 4, 65536 // 2
    assert len(rows) == 2 * 4 * reps, p.stdout
    seen = set()
    for r in rows:
        key = (r["coll"], r["variant"], int(r["rep"]))
        assert key not in seen
        seen.add(key)
        assert (r["layout"], r["rate"], int(r["size"]), int(r["elems"]), int(r["world"]),
                int(r["nodes"])) == ("2x2", "none", 65536, n, w, 2), r
        assert int(r["wrong"]) == 0, r
        # every rank checks its output: all-gather N each, reduce-scatter N / W
        assert int(r["checked"]) == (w * n if r["coll"] == "allgather" else n), r
        assert float(r["time_us"]) > 0
        assert (r["link_bytes"] == "") == r["variant"].startswith("gloo"), r
        if tuner and r["coll"] == "reducescatter" and r["variant"] == "zpp-bf16":
            # the hierarchical family ran: one partial sum of N / W bf16
            # elements crosses per rank, 2 of the busiest node's (the
            # pairwise one sends 2 shards per rank across)
            assert int(r["link_bytes"]) == 2 * (n // w) * 2, r
    assert {v for c, v, _ in seen if c == "allgather"} == set(gp.AG_VARIANTS)
    assert {v for c, v, _ in seen if c == "reducescatter"} == set(gp.RS_VARIANTS)


CORRUPT = """
import importlib.util, os, sys
import torch
import zpp
spec = importlib.util.spec_from_file_location("gloo_peer", sys.argv.pop(1))
gp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gp)
orig, calls = zpp.Comm.allgather, [0]
def allgather(self, send, out, *a, **k):
    r = orig(self, send, out, *a, **k)
    calls[0] += 1  # the untimed calls, then repetition 1's timed one
    if calls[0] == gp.UNTIMED + 1 and os.environ.get("OMPI_COMM_WORLD_RANK") == "1":
        out.view(torch.int16)[5] ^= 1
    return r
zpp.Comm.allgather = allgather
sys.exit(gp.main())
"""


def test_worker_wrong_exits_3(have_mpirun, tmp_path):
    drv = tmp_path / "corrupt.py"
    drv.write_text(CORRUPT)
    p = launch(2, [ROOT / "perf" / "gloo_peer.py", "--sizes", "8K", "--reps", "2",
                   "--colls", "allgather", "--header"], "2x1", driver=drv)
    assert p.returncode == 3, (p.returncode, p.stdout, p.stderr[-4000:])
    rows = rows_of(p.stdout)
    assert len(rows) == 4 * 2
    for r in rows:
        bad = (r["variant"], r["rep"]) == ("zpp-bf16", "1")
        assert int(r["wrong"]) == (1 if bad else 0), r
    assert "1 wrong elements" in p.stderr
    # a size of 3 elements: no multiple of 2 ranks, refused before any call
    p = launch(2, ["--sizes", "6", "--reps", "1", "--header"], "2x1")
    assert p.returncode == 2 and "not a positive multiple of the 2 ranks" in p.stderr, (
        p.returncode, p.stdout, p.stderr[-4000:])
    assert gp.HEADER not in p.stdout


def test_fsdp2_fallback_says_why(capsys, monkeypatch):
    """Where FSDP2's private _get_gradient_divide_factors cannot be had
    (here: a module without it): SUM then / W, and the reason on stderr
    (rank 0) and in the row's call field."""
    import types

    name = "torch.distributed.fsdp._fully_shard._fsdp_collectives"
    monkeypatch.setitem(sys.modules, name, types.ModuleType(name))

    class Group:
        def size(self):
            return 4

        def rank(self):
            return 0

    pre, post, op, words = gp.fsdp2_rs_plan(Group(), torch.bfloat16)
    assert (pre, post, str(op).split(".")[-1]) == (None, 4.0, "SUM")
    err = capsys.readouterr().err
    why = words.split("failed: ")[1][:-1]
    assert why.startswith("ImportError") and "_get_gradient_divide_factors" in why, words
    assert "," not in words and "\n" not in words, words
    assert why in err, (words, err)
