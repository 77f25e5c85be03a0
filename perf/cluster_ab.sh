#!/usr/bin/env bash
# Two zpp-bench binaries on the real 2 x 4 cluster (scripts/netns_cluster.sh),
# alternated in one run, so that a slow phase of the shared machine hits
# both: ROUNDS rounds of "launch A, launch B", each launch one zpp-bench of
# the same collective, variants and sizes (checked: -c 1), then the table of
# perf/cluster_ab_table.py (per size and variant: the median over the rounds
# of each launch's median time, and the ratio to the bf16 row of the same
# side).  A speed claim about a change to the host path is this table, not
# a timed test.
#   usage: perf/cluster_ab.sh BENCH_A BENCH_B OUT_PREFIX [ROUNDS]
# BENCH_A, BENCH_B: zpp-bench executables (libzpp is linked in statically,
# so a copy of one build's build/perf/zpp-bench can be kept while the other
# is built).  Writes OUT_PREFIX.csv (side, round, zpp-bench's CSV columns)
# and OUT_PREFIX.md.  ROUNDS: 1..99, default 5.
# Settings (environment): ZPP_AB_RATE (node link rate, default 1600mbit;
# none: unshaped), ZPP_AB_COLL (default reducescatter), ZPP_AB_VARIANTS
# (default bf16,qgz4,qgz8-4), ZPP_AB_MINBYTES / ZPP_AB_MAXBYTES (default 4M
# / 16M, x4), ZPP_AB_ITERS (default 15), ZPP_AB_WARMUP (default 2),
# ZPP_AB_LABEL_A / _B (names in the table; default the paths),
# ZPP_AB_ENV_A / _B (space-separated VAR=VALUE settings given to that
# side's ranks, e.g. ZPP_PIPE_MIN_CHUNK=131072: one binary, two settings),
# ZPP_AB_INTERLEAVE (1, the default: zpp-bench --interleave, the variants of
# a size round-robin; 0: one after the other, for binaries built before the
# flag, which are refused otherwise).
# Each launch
# is bounded by 300 s a try; a failed or timed-out launch ends the run with its
# output.  Each launch runs under scripts/softirq_wait.sh: one during which
# ksoftirqd waited more than ZPP_SOFTIRQ_MAX_WAIT_S (5) s on a run queue is
# discarded and run again, at most ZPP_SOFTIRQ_TRIES (3) tries; a launch
# discarded every time ends the run; the table's note gives the count.
# Needs root (exits 1 saying why if a cluster cannot be made).
set -euo pipefail
prog=cluster_ab.sh
if [ $# -lt 3 ] || [ $# -gt 4 ]; then
  echo "usage: $prog BENCH_A BENCH_B OUT_PREFIX [ROUNDS]" >&2
  exit 2
fi
a=$1 b=$2 out=$3 rounds=${4:-5}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cluster=$here/../scripts/netns_cluster.sh
table=$here/cluster_ab_table.py
. "$here/../scripts/softirq_wait.sh"
[[ "$rounds" =~ ^[1-9][0-9]?$ ]] || { echo "$prog: ROUNDS '$rounds': must be an integer 1..99" >&2; exit 2; }
for x in "$a" "$b"; do
  [ -x "$x" ] || { echo "$prog: '$x' is not an executable zpp-bench" >&2; exit 2; }
done
rate=${ZPP_AB_RATE:-1600mbit}
coll=${ZPP_AB_COLL:-reducescatter}
variants=${ZPP_AB_VARIANTS:-bf16,qgz4,qgz8-4}
minb=${ZPP_AB_MINBYTES:-4M}
maxb=${ZPP_AB_MAXBYTES:-16M}
iters=${ZPP_AB_ITERS:-15}
warmup=${ZPP_AB_WARMUP:-2}
label_a=${ZPP_AB_LABEL_A:-$a}
label_b=${ZPP_AB_LABEL_B:-$b}
envs_a=() envs_b=()
for side in A B; do
  var=ZPP_AB_ENV_$side
  read -r -a words <<< "${!var:-}"  # split on blanks, no globbing
  for kv in ${words[@]+"${words[@]}"}; do
    [[ "$kv" =~ ^[A-Z][A-Z0-9_]{0,63}=[A-Za-z0-9_.,:/-]{0,256}$ ]] || {
      echo "$prog: $var: '$kv' is not VAR=VALUE" >&2; exit 2; }
    if [ $side = A ]; then envs_a+=(-x "$kv"); else envs_b+=(-x "$kv"); fi
  done
done
[[ "$rate" =~ ^([1-9][0-9]{0,5}(k|m|g)bit|none)$ ]] || { echo "$prog: ZPP_AB_RATE '$rate': must be like 1600mbit, or none" >&2; exit 2; }
[[ "$coll" =~ ^(allgather|reducescatter)$ ]] || { echo "$prog: ZPP_AB_COLL '$coll': must be allgather or reducescatter" >&2; exit 2; }
[[ "$variants" =~ ^[a-z0-9,-]+$ ]] || { echo "$prog: ZPP_AB_VARIANTS '$variants': a comma list of zpp-bench variants" >&2; exit 2; }
for v in minb maxb; do
  [[ "${!v}" =~ ^[0-9]{1,12}[KkMmGg]?$ ]] || { echo "$prog: ZPP_AB_${v^^}YTES '${!v}': an integer with an optional K, M or G suffix" >&2; exit 2; }
done
for v in iters warmup; do
  [[ "${!v}" =~ ^[0-9]{1,4}$ ]] || { echo "$prog: ZPP_AB_${v^^} '${!v}': must be an integer 0..9999" >&2; exit 2; }
done
[ "$iters" -ge 1 ] || { echo "$prog: ZPP_AB_ITERS must be at least 1" >&2; exit 2; }
interleave=${ZPP_AB_INTERLEAVE:-1}
[[ "$interleave" =~ ^[01]$ ]] || { echo "$prog: ZPP_AB_INTERLEAVE '$interleave': must be 0 or 1" >&2; exit 2; }
if [ "$interleave" = 1 ]; then
  for x in "$a" "$b"; do
    # the flag's name in the binary's usage text (running it would start
    # MPI outside mpirun)
    grep -qaF -- '--interleave' "$x" || {
      echo "$prog: '$x' has no --interleave (built before it): set ZPP_AB_INTERLEAVE=0" >&2; exit 2; }
  done
fi
python3 -c 'import statistics' 2> /dev/null || { echo "$prog: python3 is missing" >&2; exit 1; }
if ! why=$("$cluster" check); then
  echo "$prog: $why" >&2
  exit 1
fi
mkdir -p "$(dirname "$out")"
exec 9> /run/zpp-cluster.lock
flock -w 900 9 || { echo "$prog: another cluster run holds /run/zpp-cluster.lock" >&2; exit 1; }
one=$(mktemp) err=$(mktemp)
trap 'softirq_stop; "$cluster" down > /dev/null 2>&1; rm -f "$one" "$err"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
shape=$rate; [ "$rate" = none ] && shape=0
"$cluster" up -n 2 -p 4 -r "$shape" > /dev/null
load0=$(cut -d' ' -f1-3 /proc/loadavg)
args=(--coll "$coll" --variant "$variants" -b "$minb" -e "$maxb" -f 4 -n "$iters" -w "$warmup" -c 1 --format csv)
il_env=
if [ "$interleave" = 1 ]; then args+=(--interleave); else il_env="ZPP_AB_INTERLEAVE=0 "; fi
: > "$out.csv"
for r in $(seq "$rounds"); do
  for side in A B; do
    bin=$a envs=("${envs_a[@]}")
    [ $side = B ] && bin=$b envs=("${envs_b[@]}")
    if ! softirq_launch "round $r, $side" "$one" "$err" \
        timeout -k 10 300 "$cluster" run -np 8 -x OMPI_MCA_mpi_yield_when_idle=1 "${envs[@]}" "$bin" "${args[@]}"; then
      [ "$softirq_gave_up" = 1 ] && exit 1
      echo "$prog: zpp-bench failed or timed out ($side = $bin, round $r):" >&2
      tail -n 20 "$one" "$err" >&2
      exit 1
    fi
    hdr=$(grep -m1 '^coll,' "$one" || true)
    [ -n "$hdr" ] || { echo "$prog: $bin printed no CSV header (round $r)" >&2; exit 1; }
    if [ ! -s "$out.csv" ]; then
      echo "side,round,$hdr" > "$out.csv"
    elif [ "side,round,$hdr" != "$(head -n1 "$out.csv")" ]; then
      echo "$prog: $bin's CSV columns differ from the first launch's: $hdr" >&2
      exit 1
    fi
    grep "^$coll," "$one" | sed "s/^/$side,$r,/" >> "$out.csv" || true
  done
done
python3 "$table" "$out.csv" "$out.md" \
  --label-a "$label_a" --label-b "$label_b" \
  --command "${ZPP_AB_ENV_A:+ZPP_AB_ENV_A='$ZPP_AB_ENV_A' }${ZPP_AB_ENV_B:+ZPP_AB_ENV_B='$ZPP_AB_ENV_B' }ZPP_AB_RATE=$rate ZPP_AB_COLL=$coll ZPP_AB_VARIANTS=$variants ZPP_AB_MINBYTES=$minb ZPP_AB_MAXBYTES=$maxb ZPP_AB_ITERS=$iters ZPP_AB_WARMUP=$warmup ${il_env}perf/cluster_ab.sh A B $(basename "$out") $rounds" \
  --note "$(date -u +%Y-%m-%d), $(nproc) cores, load average $load0 before and $(cut -d' ' -f1-3 /proc/loadavg) after; zpp-bench ${args[*]} on scripts/netns_cluster.sh up -n 2 -p 4 -r $shape (8 ranks, 2 nodes). $(softirq_summary | sed 's/\.$//')"
echo "$prog: wrote $out.csv and $out.md ($softirq_discards launches discarded for ksoftirqd's run-queue wait)"
