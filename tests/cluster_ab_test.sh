#!/usr/bin/env bash
# perf/cluster_ab.sh without a cluster:
#   1. perf/cluster_ab_table.py on a CSV of random times (seed printed): 2
#      sides x 5 rounds x 2 sizes x 3 variants; every cell of the table is
#      recomputed here (sorted-list medians, per-round ratios);
#   2. a CSV without a baseline row is refused;
#   3. the script refuses bad arguments and settings by name (exit 2)
#      before it makes a cluster, and a binary without --interleave unless
#      ZPP_AB_INTERLEAVE=0;
#   4. perf/compare_builds.sh likewise refuses a bad ZPP_COMPARE_INTERLEAVE
#      and builds without --interleave, passes --interleave to zpp-bench,
#      and with ZPP_COMPARE_INTERLEAVE=0 runs an old build without it (a
#      stand-in mpirun records the launch).
# usage: cluster_ab_test.sh SOURCE_DIR
set -euo pipefail
src=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
seed=${SEED:-$RANDOM}
echo "seed $seed" >&2
python3 - "$src/perf/cluster_ab_table.py" "$work" "$seed" <<'PY'
import random, subprocess, sys
table, work, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rnd = random.Random(seed)
hdr = ("side,round,coll,variant,size,count,dtype,time_us,algbw,busbw,intra_bytes,"
       "inter_bytes,ratio,max_err,wrong,inter_bytes_max,time_med_us,time_min_us,"
       "time_max_us,inter_bytes_node_max")
rows, t = [hdr], {}
for r in range(1, 6):
    for side in ("A", "B"):
        for size in (4194304, 16777216):
            for v in ("bf16", "qgz4", "qgz8-4"):
                # the reference reads the time as the CSV holds it (2
                # decimals), as the table script does
                med = float(f"{rnd.uniform(1000, 50000):.2f}")
                t[(side, size, v, r)] = med / 1e3
                rows.append(f"{side},{r},reducescatter,{v},{size},1,bf16,{med:.2f},0,0,0,0,"
                            f"{rnd.uniform(0.2, 2):.4f},,,0,{med:.2f},{med * 0.9:.2f},{med * 2:.2f},0")
open(f"{work}/in.csv", "w").write("\n".join(rows) + "\n")
subprocess.run([sys.executable, table, f"{work}/in.csv", f"{work}/out.md"], check=True)
def med(x):
    x = sorted(x); n = len(x)
    return x[n // 2] if n % 2 else (x[n // 2 - 1] + x[n // 2]) / 2
cells = {}
for line in open(f"{work}/out.md"):
    if line.startswith("| ") and "MiB" in line:
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        cells[(c[0], c[1])] = c[2:]
assert len(cells) == 6, cells
for size, name in ((4194304, "4 MiB"), (16777216, "16 MiB")):
    for v in ("bf16", "qgz4", "qgz8-4"):
        got = cells[(name, v)]
        ma = med([t[("A", size, v, r)] for r in range(1, 6)])
        mb = med([t[("B", size, v, r)] for r in range(1, 6)])
        want = [f"{ma:.2f}", f"{mb:.2f}", f"{mb / ma:.3f}"]
        for side, m in (("A", ma), ("B", mb)):
            if v == "bf16":
                want.append("-")
                continue
            per = [t[(side, size, v, r)] / t[(side, size, "bf16", r)] for r in range(1, 6)]
            base = med([t[(side, size, "bf16", r)] for r in range(1, 6)])
            want.append(f"{m / base:.3f} ({min(per):.3f}..{max(per):.3f})")
        assert got == want, (name, v, got, want)
# a round missing from one side's baseline: that side's median over the
# rounds it has, its per-round range over the rounds both rows have
open(f"{work}/gap.csv", "w").write("\n".join(
    [hdr] + [l for l in rows[1:] if not l.startswith("A,5,reducescatter,bf16,4194304,")]) + "\n")
subprocess.run([sys.executable, table, f"{work}/gap.csv", f"{work}/gap.md"], check=True)
row = [l for l in open(f"{work}/gap.md") if l.startswith("| 4 MiB | qgz4 |")][0]
c = [x.strip() for x in row.strip().strip("|").split("|")]
base = med([t[("A", 4194304, "bf16", r)] for r in range(1, 5)])
ma = med([t[("A", 4194304, "qgz4", r)] for r in range(1, 6)])
per = [t[("A", 4194304, "qgz4", r)] / t[("A", 4194304, "bf16", r)] for r in range(1, 5)]
want = f"{ma / base:.3f} ({min(per):.3f}..{max(per):.3f})"
assert c[5] == want, (c, want)
# no baseline row: refused
open(f"{work}/nobase.csv", "w").write("\n".join(
    [hdr] + [l for l in rows[1:] if ",bf16,4194304," not in l and ",bf16,16777216," not in l]) + "\n")
p = subprocess.run([sys.executable, table, f"{work}/nobase.csv", f"{work}/x.md"],
                   capture_output=True, text=True)
assert p.returncode != 0 and "baseline" in p.stderr, (p.returncode, p.stderr)
print("table: ok")
PY
# ---- 3. refusals ------------------------------------------------------------
ab=$src/perf/cluster_ab.sh
true_bin=$(type -P true)
expect() {  # expect EXIT_CODE TEXT -- command...
  local code=$1 text=$2 rc=0 out
  shift 3
  out=$("$@" 2>&1) || rc=$?
  [ "$rc" = "$code" ] || fail "$*: exit $rc, wanted $code ($out)"
  [[ "$out" == *"$text"* ]] || fail "$*: '$out' does not say '$text'"
}
expect 2 "usage" -- bash "$ab" "$true_bin"
expect 2 "ROUNDS 'x'" -- bash "$ab" "$true_bin" "$true_bin" "$work/o" x
expect 2 "'$work/nothere' is not an executable" -- bash "$ab" "$work/nothere" "$true_bin" "$work/o"
expect 2 "ZPP_AB_RATE '16'" -- env ZPP_AB_RATE=16 bash "$ab" "$true_bin" "$true_bin" "$work/o"
expect 2 "ZPP_AB_COLL 'hpz'" -- env ZPP_AB_COLL=hpz bash "$ab" "$true_bin" "$true_bin" "$work/o"
expect 2 "ZPP_AB_MAXBYTES '4X'" -- env ZPP_AB_MAXBYTES=4X bash "$ab" "$true_bin" "$true_bin" "$work/o"
expect 2 "ZPP_AB_ITERS must be at least 1" -- env ZPP_AB_ITERS=0 bash "$ab" "$true_bin" "$true_bin" "$work/o"
expect 2 "ZPP_AB_ENV_B: 'b;c' is not VAR=VALUE" -- env "ZPP_AB_ENV_B=ZPP_X=a b;c" bash "$ab" "$true_bin" "$true_bin" "$work/o"
expect 2 "ZPP_AB_ENV_A: 'lower=1' is not VAR=VALUE" -- env "ZPP_AB_ENV_A=ZPP_OK=1 lower=1" bash "$ab" "$true_bin" "$true_bin" "$work/o"
expect 2 "ZPP_AB_INTERLEAVE 'yes'" -- env ZPP_AB_INTERLEAVE=yes bash "$ab" "$true_bin" "$true_bin" "$work/o"
# --interleave by default: a binary without it is refused by name
expect 2 "'$true_bin' has no --interleave" -- bash "$ab" "$true_bin" "$true_bin" "$work/o"
[ ! -e "$work/o.csv" ] || fail "a refused run wrote $work/o.csv"
# ---- 4. perf/compare_builds.sh's refusals (before any run) ------------------
cb=$src/perf/compare_builds.sh
mkdir -p "$work/old/perf"
ln -s "$true_bin" "$work/old/perf/zpp-bench"
expect 2 "ZPP_COMPARE_INTERLEAVE '2'" -- env ZPP_COMPARE_INTERLEAVE=2 bash "$cb" "$work/old" "$work/old" "$work/c.md"
expect 2 "$work/old/perf/zpp-bench has no --interleave" -- bash "$cb" "$work/old" "$work/old" "$work/c.md"
[ ! -e "$work/c.md" ] || fail "a refused compare_builds wrote $work/c.md"
# what reaches mpirun: a stand-in first on PATH logs its arguments and
# fails, which ends the script after the first launch
mkdir -p "$work/bin" "$work/new/perf"
printf '#!/bin/sh\necho "$*" >> "%s/mpirun.log"\nexit 1\n' "$work" > "$work/bin/mpirun"
printf '#!/bin/sh\n# a zpp-bench whose usage names --interleave\nexit 0\n' > "$work/new/perf/zpp-bench"
chmod +x "$work/bin/mpirun" "$work/new/perf/zpp-bench"
expect 1 "zpp-bench failed" -- env PATH="$work/bin:$PATH" bash "$cb" "$work/new" "$work/new" "$work/c.md" 1 unlimited
grep -q -- ' --interleave ' "$work/mpirun.log" || fail "compare_builds did not pass --interleave: $(cat "$work/mpirun.log")"
rm -f "$work/mpirun.log"
expect 1 "zpp-bench failed" -- env PATH="$work/bin:$PATH" ZPP_COMPARE_INTERLEAVE=0 bash "$cb" "$work/old" "$work/old" "$work/c.md" 1 unlimited
[ -s "$work/mpirun.log" ] && ! grep -q -- '--interleave' "$work/mpirun.log" ||
  fail "ZPP_COMPARE_INTERLEAVE=0: $(cat "$work/mpirun.log" 2>/dev/null)"
echo "cluster_ab: ok"
