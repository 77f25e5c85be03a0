#!/usr/bin/env bash
# perf/cluster_train.sh with stand-ins: a stand-in scripts/netns_cluster.sh
# (ZPP_CLUSTER_TRAIN_CLUSTER: logs check, up, down and run; run starts the
# program directly and notes whether the study's lock is held) and a
# stand-in zpp-train (prints step lines and the JSON object the study
# reads, with step times that depend on the mode, batch, rate and its call
# number, and logs what it printed), a lock file and a load average of the
# test's own (ZPP_CLUSTER_TRAIN_LOCK, ZPP_CLUSTER_TRAIN_LOADAVG):
#   1. two rates x two batches, 4 repetitions: per block one up at the
#      rate, zero3 and zeropp alternated with the block's flags, one down,
#      every run under the lock; the tables' medians, min..max, speedups
#      (of the medians, median paired), inter-node MB per rank, per
#      repetition cells and the target's line are the ones computed here
#      from what the stand-in printed;
#   2. a failed run (exit 1) fails the study, is named and left out of the
#      medians and of the pairs; a run whose zpp-train saw 1 node fails it;
#   3. a hanging run is killed after ZPP_CLUSTER_TRAIN_TIMEOUT_S; a TERM
#      (or HUP) to the study ends it at once, ends the launch and tears
#      down, and leaves OUT_DIR's earlier tables as they were; the ranks
#      never get the lock's fd 9;
#   4. the load wait: above the limit it waits at most
#      ZPP_CLUSTER_TRAIN_LOAD_WAIT_S, the table shows the load; a limit of
#      0.0 does not wait; a TERM during the wait ends the study at once;
#      with the lock held by another run: a TERM while waiting for it ends
#      the study at once without touching the cluster, and once the lock
#      is free the block's "load before" is the one after the lock wait;
#   5. a cluster that cannot be made: exit 77 with the reason, nothing run;
#   6. bad settings are refused by name, before anything runs; a missing
#      BUILD_DIR is named (exit 1);
#   7. ksoftirqd's run-queue wait (a fake proc root, ZPP_SOFTIRQ_PROC,
#      whose ksoftirqd/0 the stand-in zpp-train makes wait 6 s on the calls
#      in FAKE_SOFTIRQ_AT): a launch over the limit is run again and the
#      kept try's row is the one in the CSV, the table's notes count the
#      discard; a launch over it in every try is a failed run, named.
# usage: cluster_train_test.sh SOURCE_DIR
set -euo pipefail
src=$1
study=$src/perf/cluster_train.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/build/tools"
fail() { echo "FAIL: $*" >&2; exit 1; }

cat > "$work/cluster" <<EOF
#!/usr/bin/env bash
# stand-in scripts/netns_cluster.sh
case \$1 in
  check)
    if [ -n "\${FAKE_NO_CLUSTER:-}" ]; then echo "netns_cluster.sh: cannot make a cluster here: no namespaces (stand-in)"; exit 77; fi ;;
  up) echo "up \${*:2}" >> "$work/calls"; echo "\$7" > "$work/rate" ;;
  down) echo "down" >> "$work/calls"; rm -f "$work/rate" ;;
  run)
    shift
    pre=()
    while [ \$# -gt 0 ]; do
      case \$1 in
        -np|-x) pre+=("\$1" "\$2"); shift 2 ;;
        *) break ;;
      esac
    done
    if flock -n "$work/lock" true; then held=UNLOCKED; else held=locked; fi
    echo "run \$held \${pre[*]} | \${*:2}" >> "$work/calls"
    FAKE_RATE=\$(cat "$work/rate") exec "\$@" ;;
  *) echo "stand-in cluster: unknown command \$1" >&2; exit 2 ;;
esac
EOF
chmod +x "$work/cluster"

cat > "$work/build/tools/zpp-train" <<EOF
#!/usr/bin/env bash
# stand-in zpp-train: step time = base(mode, batch, rate) * (1 + k % 7 / 20),
# k its call number; inter-node bytes those of the real --large run
mode= batch= steps=
while [ \$# -gt 0 ]; do
  case \$1 in
    --mode) mode=\$2; shift ;;
    --batch) batch=\$2; shift ;;
    --steps) steps=\$2; shift ;;
  esac
  shift
done
k=\$(( \$(cat "$work/count" 2> /dev/null || echo 0) + 1 ))
echo \$k > "$work/count"
# the study's lock (fd 9) must not reach the ranks: a rank that outlives
# the study would hold it and block every later cluster run
if [ -e /proc/\$\$/fd/9 ]; then echo "call \$k" >> "$work/fd9"; fi
if [ "\${FAKE_HANG_AT:-}" = \$k ]; then echo \$\$ > "$work/hang.pid"; exec sleep 1000; fi
if [ "\${FAKE_FAIL_AT:-}" = \$k ]; then echo "stand-in: failing call \$k" >&2; exit 1; fi
if [[ " \${FAKE_SOFTIRQ_AT:-} " == *" \$k "* ]]; then
  read -r a w b < "$work/proc/14/schedstat"
  echo "\$a \$((w + 6000000000)) \$b" > "$work/proc/14/schedstat"
fi
case \$FAKE_RATE in 400mbit) r=3 ;; 1600mbit) r=2 ;; *) r=1 ;; esac
t=\$(awk -v m=\$mode -v b=\$batch -v r=\$r -v k=\$k 'BEGIN {
  base = (m == "zero3" ? 0.2 * r : 0.11 + 0.02 * r) + b / 1000
  printf "%.6f", base * (1 + (k % 7) / 20) }')
if [ \$mode = zero3 ]; then inter=4746240; else inter=1211280; fi
# phase_s: forward, its wait, backward, its wait, drain (fractions of t
# that depend on the call, so that the medians are of their own)
ph=(\$(awk -v t=\$t -v k=\$k 'BEGIN {
  printf "%.6f %.6f %.6f %.6f %.6f", t * (0.3 + k % 3 / 100), t * (0.1 + k % 5 / 100),
    t * (0.6 - k % 4 / 100), t * (0.2 + k % 2 / 100), t * 0.05 }'))
for ((i = 1; i <= steps; i++)); do echo "step \$i loss 0.5  time \$t s"; done
echo "\$FAKE_RATE \$batch \$mode \$t \$inter \${ph[*]}" >> "$work/truth"
echo "{\"mode\": \"\$mode\", \"world_size\": 8, \"nodes\": \${FAKE_NODES:-2}, \"steps\": \$steps, \"inter_bytes_per_step\": \$((inter * 8)), \"step_time_s\": \$t, \"first_step_time_s\": 1.5, \"phase_s\": {\"forward\": \${ph[0]}, \"backward\": \${ph[2]}, \"drain\": \${ph[4]}, \"optimizer\": 0.001, \"wait_params_forward\": \${ph[1]}, \"wait_backward\": \${ph[3]}}, \"inter_bytes_per_step_per_rank\": [\$inter, \$inter, \$inter, \$((inter + 8)), \$inter, \$inter, \$inter, \$inter]}"
EOF
chmod +x "$work/build/tools/zpp-train"
echo "0.50 0.40 0.30 1/100 4242" > "$work/loadavg"
# a proc root with one ksoftirqd whose wait only the stand-in moves
mkdir -p "$work/proc/14"
echo ksoftirqd/0 > "$work/proc/14/comm"
echo "100 2000000000 7" > "$work/proc/14/schedstat"

study_run() { # extra environment as arguments
  rm -f "$work/calls" "$work/truth" "$work/count"
  rm -rf "$work/out"
  env ZPP_SOFTIRQ_PROC="$work/proc" ZPP_CLUSTER_TRAIN_CLUSTER="$work/cluster" ZPP_CLUSTER_TRAIN_LOCK="$work/lock" \
    ZPP_CLUSTER_TRAIN_LOADAVG="$work/loadavg" ZPP_CLUSTER_TRAIN_RATES=400mbit \
    ZPP_CLUSTER_TRAIN_BATCHES=64 ZPP_CLUSTER_TRAIN_REPS=3 ZPP_CLUSTER_TRAIN_STEPS=4 "$@" \
    timeout 60 bash "$study" "$work/out" "$work/build" 2> "$work/err"
}
count() { if [ -f "$work/$1" ]; then grep -c "${2:-.}" "$work/$1" || true; else echo 0; fi; }

# the tables as computed here: one line per expected table row or cell
expect() { # truth file -> expected markdown lines
  python3 - "$work/truth" "$1" <<'PY'
import sys
truth, reps = sys.argv[1], int(sys.argv[2])
link = {"400mbit": "0.4 Gbit/s (100 GbE scaled)", "1600mbit": "1.6 Gbit/s (NDR scaled)", "none": "unshaped"}
runs = {}
phases = {}
for l in open(truth):
    rate, batch, mode, t, inter, *ph = l.split()
    runs.setdefault((rate, batch), []).append((mode, float(t), int(inter)))
    phases.setdefault((rate, batch, mode), []).append([float(x) for x in ph])
def med(v):
    v = sorted(v); n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
for (rate, batch), rs in runs.items():
    assert [m for m, _, _ in rs] == ["zero3", "zeropp"] * reps, rs
    z3 = [t for m, t, _ in rs if m == "zero3"]
    zp = [t for m, t, _ in rs if m == "zeropp"]
    pairs = [a / b for a, b in zip(z3, zp)]
    i3 = [i for m, _, i in rs if m == "zero3"][0] / 1e6
    ip = [i for m, _, i in rs if m == "zeropp"][0] / 1e6
    print(f"| {link[rate]} | {batch} | {2 * reps}/{2 * reps} | {med(z3) * 1e3:.1f} | "
          f"{min(z3) * 1e3:.1f}..{max(z3) * 1e3:.1f} | {med(zp) * 1e3:.1f} | "
          f"{min(zp) * 1e3:.1f}..{max(zp) * 1e3:.1f} | {med(z3) / med(zp):.2f} | "
          f"{med(pairs):.2f} | {min(pairs):.2f}..{max(pairs):.2f} | {i3:.2f} | {ip:.2f} |")
    print(f"| {link[rate]} | {batch} | " + " | ".join(
        f"{a * 1e3:.1f} / {b * 1e3:.1f} = {a / b:.2f}" for a, b in zip(z3, zp)) + " |")
    for m in ("zero3", "zeropp"):
        cols = list(zip(*phases[(rate, batch, m)]))
        assert len(cols) == 5, cols
        print(f"| {link[rate]} | {batch} | {m} | " +
              " | ".join(f"{med(c) * 1e3:.1f}" for c in cols) + " |")
    if (rate, batch) == ("400mbit", "64"):
        s, p = med(z3) / med(zp), med(pairs)
        v = "met" if s >= 2 and p >= 2 else "not met" if s < 2 and p < 2 else "not settled"
        print(f"speedup of the medians {s:.3f}, median paired speedup {p:.3f} "
              f"({min(pairs):.3f}..{max(pairs):.3f} over {reps} repetitions): {v}")
PY
}

# ---- 1. two rates x two batches, 4 repetitions (an even count) ------------
study_run ZPP_CLUSTER_TRAIN_RATES="400mbit none" ZPP_CLUSTER_TRAIN_BATCHES="64 8" \
  ZPP_CLUSTER_TRAIN_REPS=4 || fail "first study: $(tail -3 "$work/err")"
md=$work/out/cluster_train.md
[ "$(count calls '^up ')" = 4 ] || fail "$(count calls '^up ') ups, want 4 (one per block)"
[ "$(count calls '^down')" = 4 ] || fail "$(count calls '^down') downs, want 4"
[ "$(count calls '^run ')" = 32 ] || fail "$(count calls '^run ') runs, want 32"
[ "$(count calls '^run UNLOCKED')" = 0 ] || fail "a run without the lock held"
[ ! -e "$work/fd9" ] || fail "the ranks got the lock's fd 9 ($(count fd9) calls)"
[ "$(count out/cluster_train.csv ',ok,')" = 32 ] || fail "the CSV has $(count out/cluster_train.csv ',ok,') ok rows, want 32"
# the order: up RATE, 4 x (zero3, zeropp) with the block's batch, down
python3 - "$work/calls" <<'PY' || fail "launch order (above)"
import sys
lines = [l.rstrip("\n") for l in open(sys.argv[1])]
want = []
for rate in ("400mbit", "none"):
    for batch in ("64", "8"):
        want.append(f"up -n 2 -p 4 -r {rate}")
        for _ in range(4):
            for m in ("zero3", "zeropp"):
                want.append(f"run locked -np 8 -x OMPI_MCA_mpi_yield_when_idle=1 | "
                            f"--mode {m} --large --batch {batch} --steps 4 --json")
        want.append("down")
if lines != want:
    for a, b in zip(lines + [""] * len(want), want + [""] * len(lines)):
        if a != b:
            sys.exit(f"call {a!r}, want {b!r}")
PY
expect 4 > "$work/want"
[ "$(wc -l < "$work/want")" = 17 ] || fail "expected $(wc -l < "$work/want") lines, want 17"
while IFS= read -r line; do
  grep -qF -- "$line" "$md" || fail "the table lacks: $line"
done < "$work/want"
grep -q "^| unshaped | 8 | 0.50 0.40 0.30 | 0 | 0.50 0.40 0.30 |" "$md" || fail "no load row for unshaped, batch 8"
grep -qF "Run: \`ZPP_CLUSTER_TRAIN_RATES='400mbit none' ZPP_CLUSTER_TRAIN_REPS=4 ZPP_CLUSTER_TRAIN_STEPS=4 perf/cluster_train.sh OUT_DIR BUILD_DIR\`" "$md" ||
  fail "the invocation: $(grep '^Run:' "$md")"
grep -qF "up -n 2 -p 4 -r RATE" "$md" || fail "no command above the table"
grep -qF -- "--mode zeropp --large --batch B --steps 4 --json" "$md" || fail "no zeropp command in the table's header"
# the CSV's per-rank bytes: the mean and the busiest rank
grep -q "^400mbit,64,1,zero3,4,ok,[0-9.]*,1.500000,[0-9.]*,4746240,4746248,2,8,$(head -1 "$work/truth" | cut -d' ' -f6- | tr ' ' ,)$" "$work/out/cluster_train.csv" ||
  fail "CSV row: $(sed -n 2p "$work/out/cluster_train.csv")"

# ---- 2. failed runs -------------------------------------------------------
# call 2 is rep 1's zeropp: out of zeropp's median and of the pairs
if study_run FAKE_FAIL_AT=2; then fail "a failed run did not fail the study"; fi
grep -q "rep 1, zeropp failed: exit 1" "$work/err" || fail "the failure is not named: $(tail -3 "$work/err")"
grep -q "^- 400mbit, batch 64, rep 1, zeropp: exit 1$" "$work/out/cluster_train.md" || fail "the table does not list the failed run"
[ "$(count calls '^down')" = 1 ] || fail "no teardown after a failed run"
python3 - "$work/truth" "$work/out/cluster_train.md" <<'PY' || fail "failed run: table (above)"
import sys
rs = [l.split() for l in open(sys.argv[1])]  # calls 1, 3, 4, 5, 6
z3 = [float(r[3]) for r in rs if r[2] == "zero3"]
zp = [float(r[3]) for r in rs if r[2] == "zeropp"]
assert len(z3) == 3 and len(zp) == 2, (z3, zp)
pairs = sorted([z3[1] / zp[0], z3[2] / zp[1]])
want = (f"| 5/6 | {sorted(z3)[1] * 1e3:.1f} | {min(z3) * 1e3:.1f}..{max(z3) * 1e3:.1f} | "
        f"{(zp[0] + zp[1]) / 2 * 1e3:.1f} | {min(zp) * 1e3:.1f}..{max(zp) * 1e3:.1f} | "
        f"{sorted(z3)[1] / ((zp[0] + zp[1]) / 2):.2f} | {(pairs[0] + pairs[1]) / 2:.2f} | "
        f"{pairs[0]:.2f}..{pairs[1]:.2f} |")
text = open(sys.argv[2]).read()
if want not in text:
    sys.exit(f"the table lacks {want}")
if f"{z3[0] * 1e3:.1f} / - |" not in text:
    sys.exit("rep 1's cell does not show the missing zeropp")
PY
if study_run FAKE_NODES=1 ZPP_CLUSTER_TRAIN_REPS=1; then fail "a run on 1 node did not fail the study"; fi
grep -q "zero3: zpp-train saw 1 nodes (want 2)" "$work/out/cluster_train.md" || fail "the 1-node run is not named in the table"

# ---- 3. a hanging run, and a TERM to the study ----------------------------
t0=$(date +%s)
if study_run FAKE_HANG_AT=1 ZPP_CLUSTER_TRAIN_REPS=1 ZPP_CLUSTER_TRAIN_TIMEOUT_S=2; then
  fail "a hanging run did not fail the study"
fi
t1=$(date +%s)
[ $((t1 - t0)) -le 15 ] || fail "the hanging run was stopped after $((t1 - t0)) s, limit 2 s"
grep -q "rep 1, zero3: timeout after 2 s" "$work/out/cluster_train.md" || fail "the timeout is not named in the table"
[ "$(count calls '^run ')" = 2 ] || fail "after the timeout: $(count calls '^run ') runs, want 2 (the study goes on)"
rm -f "$work/hang.pid"
rm -f "$work/calls" "$work/count"
# the tables of an earlier study in OUT_DIR must outlive a study that stops
echo "earlier csv" > "$work/out/cluster_train.csv"
echo "earlier md" > "$work/out/cluster_train.md"
env ZPP_CLUSTER_TRAIN_CLUSTER="$work/cluster" ZPP_CLUSTER_TRAIN_LOCK="$work/lock" \
  ZPP_CLUSTER_TRAIN_LOADAVG="$work/loadavg" ZPP_CLUSTER_TRAIN_RATES=400mbit \
  ZPP_CLUSTER_TRAIN_BATCHES=64 ZPP_CLUSTER_TRAIN_REPS=1 ZPP_CLUSTER_TRAIN_TIMEOUT_S=50 \
  FAKE_HANG_AT=1 bash "$study" "$work/out" "$work/build" 2> "$work/err" &
pid=$!  # the study itself: TERM goes to it, not to a wrapper
for ((i = 0; i < 100; i++)); do [ -s "$work/hang.pid" ] && break; sleep 0.1; done
[ -s "$work/hang.pid" ] || fail "the hanging stand-in did not start within 10 s"
t0=$(date +%s)
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
t1=$(date +%s)
[ "$rc" = 143 ] || fail "TERM: exit $rc, want 143"
[ $((t1 - t0)) -le 5 ] || fail "TERM: the study took $((t1 - t0)) s to end"
[ "$(tail -n 1 "$work/calls")" = down ] || fail "TERM: no teardown (last call: $(tail -n 1 "$work/calls"))"
[ "$(cat "$work/out/cluster_train.csv")" = "earlier csv" ] || fail "TERM: the earlier CSV was overwritten"
[ "$(cat "$work/out/cluster_train.md")" = "earlier md" ] || fail "TERM: the earlier table was overwritten"
for ((i = 0; i < 50; i++)); do kill -0 "$(cat "$work/hang.pid")" 2> /dev/null || break; sleep 0.1; done
if kill -0 "$(cat "$work/hang.pid")" 2> /dev/null; then
  kill -KILL "$(cat "$work/hang.pid")"
  fail "TERM: the launch still runs after the study ended"
fi

# a HUP ends it the same way (bash runs the EXIT trap on a fatal signal)
rm -f "$work/calls" "$work/count" "$work/hang.pid"
env ZPP_CLUSTER_TRAIN_CLUSTER="$work/cluster" ZPP_CLUSTER_TRAIN_LOCK="$work/lock" \
  ZPP_CLUSTER_TRAIN_LOADAVG="$work/loadavg" ZPP_CLUSTER_TRAIN_RATES=400mbit \
  ZPP_CLUSTER_TRAIN_BATCHES=64 ZPP_CLUSTER_TRAIN_REPS=1 ZPP_CLUSTER_TRAIN_TIMEOUT_S=50 \
  FAKE_HANG_AT=1 bash "$study" "$work/out" "$work/build" 2> "$work/err" &
pid=$!
for ((i = 0; i < 100; i++)); do [ -s "$work/hang.pid" ] && break; sleep 0.1; done
[ -s "$work/hang.pid" ] || fail "HUP: the hanging stand-in did not start within 10 s"
kill -HUP "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" = 129 ] || fail "HUP: exit $rc, want 129"
[ "$(tail -n 1 "$work/calls")" = down ] || fail "HUP: no teardown (last call: $(tail -n 1 "$work/calls"))"
for ((i = 0; i < 50; i++)); do kill -0 "$(cat "$work/hang.pid")" 2> /dev/null || break; sleep 0.1; done
if kill -0 "$(cat "$work/hang.pid")" 2> /dev/null; then
  kill -KILL "$(cat "$work/hang.pid")"
  fail "HUP: the launch still runs after the study ended"
fi

# ---- 4. the load wait -----------------------------------------------------
echo "9.50 8.25 7.00 3/100 4242" > "$work/loadavg"
t0=$(date +%s)
study_run ZPP_CLUSTER_TRAIN_REPS=1 ZPP_CLUSTER_TRAIN_MAX_LOAD=3 ZPP_CLUSTER_TRAIN_LOAD_WAIT_S=2 ||
  fail "high load: $(tail -3 "$work/err")"
t1=$(date +%s)
[ $((t1 - t0)) -ge 2 ] || fail "high load: the study did not wait ($((t1 - t0)) s)"
grep -q "still not below 3 after 2 s" "$work/err" || fail "high load: the wait's end is not said"
grep -q "^| 0.4 Gbit/s (100 GbE scaled) | 64 | 9.50 8.25 7.00 | [23] | 9.50 8.25 7.00 |" "$work/out/cluster_train.md" ||
  fail "high load: the load row: $(grep '^| 0.4' "$work/out/cluster_train.md" | tail -1)"
t0=$(date +%s)
study_run ZPP_CLUSTER_TRAIN_REPS=1 ZPP_CLUSTER_TRAIN_MAX_LOAD=9.6 ZPP_CLUSTER_TRAIN_LOAD_WAIT_S=30 ||
  fail "load below the limit: $(tail -3 "$work/err")"
t1=$(date +%s)
[ $((t1 - t0)) -le 10 ] || fail "load 9.50 below a limit of 9.6: the study waited"
t0=$(date +%s)
study_run ZPP_CLUSTER_TRAIN_REPS=1 ZPP_CLUSTER_TRAIN_MAX_LOAD=0.0 ZPP_CLUSTER_TRAIN_LOAD_WAIT_S=30 ||
  fail "MAX_LOAD 0.0: $(tail -3 "$work/err")"
t1=$(date +%s)
[ $((t1 - t0)) -le 10 ] || fail "MAX_LOAD 0.0 (no wait) waited $((t1 - t0)) s"
# a TERM during the load wait ends the study at once, before any cluster
rm -f "$work/calls" "$work/count"
env ZPP_CLUSTER_TRAIN_CLUSTER="$work/cluster" ZPP_CLUSTER_TRAIN_LOCK="$work/lock" \
  ZPP_CLUSTER_TRAIN_LOADAVG="$work/loadavg" ZPP_CLUSTER_TRAIN_RATES=400mbit \
  ZPP_CLUSTER_TRAIN_BATCHES=64 ZPP_CLUSTER_TRAIN_REPS=1 ZPP_CLUSTER_TRAIN_MAX_LOAD=3 \
  ZPP_CLUSTER_TRAIN_LOAD_WAIT_S=60 bash "$study" "$work/out" "$work/build" 2> "$work/err" &
pid=$!
for ((i = 0; i < 100; i++)); do grep -q "waiting for the 1-minute" "$work/err" && break; sleep 0.1; done
grep -q "waiting for the 1-minute" "$work/err" || fail "load wait: not started within 10 s"
t0=$(date +%s)
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
t1=$(date +%s)
[ "$rc" = 143 ] || fail "TERM in the load wait: exit $rc, want 143"
[ $((t1 - t0)) -le 5 ] || fail "TERM in the load wait: the study took $((t1 - t0)) s to end"
[ "$(count calls)" = 0 ] || fail "TERM in the load wait: $(count calls) cluster calls, want 0"
echo "0.50 0.40 0.30 1/100 4242" > "$work/loadavg"

# ---- 4b. the lock held by another run -------------------------------------
# The holder: a process of the test's own holding the lock (as another
# cluster run would), killed by its pid.
hold_lock() {
  bash -c 'exec 8> "$1"; flock 8; exec sleep 60' _ "$work/lock" &
  holder=$!
  for ((i = 0; i < 50; i++)); do flock -n "$work/lock" true || return 0; sleep 0.1; done
  fail "the test's lock holder did not take the lock"
}
lock_study() { # extra environment as arguments; in the background: pid
  rm -f "$work/calls" "$work/count"
  env ZPP_CLUSTER_TRAIN_CLUSTER="$work/cluster" ZPP_CLUSTER_TRAIN_LOCK="$work/lock" \
    ZPP_CLUSTER_TRAIN_LOADAVG="$work/loadavg" ZPP_CLUSTER_TRAIN_RATES=400mbit \
    ZPP_CLUSTER_TRAIN_BATCHES=64 ZPP_CLUSTER_TRAIN_REPS=1 ZPP_CLUSTER_TRAIN_STEPS=4 \
    ZPP_CLUSTER_TRAIN_MAX_LOAD=0 "$@" bash "$study" "$work/out" "$work/build" 2> "$work/err" &
  pid=$!
  for ((i = 0; i < 100; i++)); do grep -q "holds .*: waiting for it" "$work/err" && return 0; sleep 0.1; done
  kill -KILL "$holder"
  fail "lock held: the study does not say it waits for the lock: $(cat "$work/err")"
}
# a TERM while waiting: exit 143 at once, no up, no down (the cluster is
# the holder's), the holder keeps its lock
hold_lock
lock_study
t0=$(date +%s)
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
t1=$(date +%s)
if flock -n "$work/lock" true; then held=0; else held=1; fi
kill "$holder" 2> /dev/null || true  # gone already if the study waited 60 s
wait "$holder" 2> /dev/null || true
[ "$rc" = 143 ] || fail "TERM in the lock wait: exit $rc, want 143"
[ $((t1 - t0)) -le 5 ] || fail "TERM in the lock wait: the study took $((t1 - t0)) s to end"
[ "$(count calls)" = 0 ] || fail "TERM in the lock wait: cluster calls: $(cat "$work/calls")"
[ "$held" = 1 ] || fail "TERM in the lock wait: the holder lost its lock"
# the holder lets go: the study runs, and its "load before" is the one
# after the wait for the lock (another run's load is not ours)
echo "5.00 4.00 3.00 3/100 4242" > "$work/loadavg"
hold_lock
lock_study
echo "0.70 0.60 0.50 1/100 4242" > "$work/loadavg"
kill "$holder" 2> /dev/null || true  # gone already if the study waited 60 s
wait "$holder" 2> /dev/null || true
rc=0
wait "$pid" || rc=$?
[ "$rc" = 0 ] || fail "after the lock wait: exit $rc: $(tail -3 "$work/err")"
[ "$(count calls '^run locked')" = 2 ] || fail "after the lock wait: $(count calls '^run locked') runs under the lock, want 2"
grep -q "^| 0.4 Gbit/s (100 GbE scaled) | 64 | 0.70 0.60 0.50 | 0 |" "$work/out/cluster_train.md" ||
  fail "after the lock wait: the load row: $(grep '^| 0.4 .* | [0-9]* | .* | [0-9]* | [0-9:]* |$' "$work/out/cluster_train.md")"
echo "0.50 0.40 0.30 1/100 4242" > "$work/loadavg"

# ---- 5. no cluster here ---------------------------------------------------
rc=0
study_run FAKE_NO_CLUSTER=1 || rc=$?
[ "$rc" = 77 ] || fail "no cluster: exit $rc, want 77"
grep -q "skipped: .*no namespaces (stand-in)" "$work/err" || fail "no cluster: the reason is not given: $(cat "$work/err")"
[ "$(count calls)" = 0 ] || fail "no cluster: $(count calls) calls, want 0"

# ---- 6. bad settings ------------------------------------------------------
bad() { # VAR VALUE
  local rc=0
  study_run "$1=$2" || rc=$?
  [ "$rc" = 2 ] || fail "$1='$2': exit $rc, want 2"
  grep -q "$1" "$work/err" || fail "$1='$2': the message does not name it: $(cat "$work/err")"
  [ "$(count calls)" = 0 ] || fail "$1='$2': something ran"
}
bad ZPP_CLUSTER_TRAIN_REPS 0
bad ZPP_CLUSTER_TRAIN_REPS x
bad ZPP_CLUSTER_TRAIN_STEPS 1
bad ZPP_CLUSTER_TRAIN_STEPS -3
bad ZPP_CLUSTER_TRAIN_BATCHES 12
bad ZPP_CLUSTER_TRAIN_BATCHES ""
bad ZPP_CLUSTER_TRAIN_RATES 0.4gbit
bad ZPP_CLUSTER_TRAIN_RATES "400mbit fast"
bad ZPP_CLUSTER_TRAIN_RATES "400mbit none 400mbit"
bad ZPP_CLUSTER_TRAIN_BATCHES "64 8 64"
bad ZPP_CLUSTER_TRAIN_TIMEOUT_S 0
bad ZPP_CLUSTER_TRAIN_MAX_LOAD -1
bad ZPP_CLUSTER_TRAIN_LOAD_WAIT_S 1.5
# a BUILD_DIR that does not exist: exit 1 naming zpp-train, nothing run
rm -f "$work/calls"
rc=0
env ZPP_CLUSTER_TRAIN_CLUSTER="$work/cluster" ZPP_CLUSTER_TRAIN_LOCK="$work/lock" \
  ZPP_CLUSTER_TRAIN_LOADAVG="$work/loadavg" timeout 60 bash "$study" "$work/out" "$work/nobuild" 2> "$work/err" || rc=$?
[ "$rc" = 1 ] || fail "no build dir: exit $rc, want 1"
grep -q "no $work/nobuild/tools/zpp-train: build first" "$work/err" || fail "no build dir: not said: $(cat "$work/err")"
[ "$(count calls)" = 0 ] || fail "no build dir: something ran"

# ---- 7. ksoftirqd's run-queue wait ------------------------------------------
# call 2 (rep 1's zeropp) waits 6 s: discarded, call 3 is its row
study_run ZPP_CLUSTER_TRAIN_REPS=2 FAKE_SOFTIRQ_AT=2 || fail "a discarded launch: $(tail -3 "$work/err")"
[ "$(count calls '^run ')" = 5 ] || fail "a discarded launch: $(count calls '^run ') runs, want 5 (one again)"
[ "$(count out/cluster_train.csv ',ok,')" = 4 ] || fail "a discarded launch: $(count out/cluster_train.csv ',ok,') ok rows, want 4"
t3=$(sed -n 3p "$work/truth" | cut -d' ' -f4)
grep -q "^400mbit,64,1,zeropp,4,ok,$t3," "$work/out/cluster_train.csv" ||
  fail "a discarded launch: rep 1's zeropp row is not the kept try's (step $t3): $(grep ',1,zeropp,' "$work/out/cluster_train.csv")"
grep -q "launch discarded, running it again (try 2 of 3)" "$work/err" || fail "a discarded launch: not said: $(cat "$work/err")"
grep -q "^Run-queue wait of ksoftirqd .*: 1 launch discarded and run again for more than 5 s .*over 4 launches kept\.$" "$work/out/cluster_train.md" ||
  fail "a discarded launch: the table's note: $(grep -i ksoftirqd "$work/out/cluster_train.md")"
# calls 1-3 (rep 1's zero3, every try) wait 6 s: a failed run
if study_run ZPP_CLUSTER_TRAIN_REPS=1 FAKE_SOFTIRQ_AT="1 2 3"; then fail "a launch discarded 3 times did not fail the study"; fi
[ "$(count calls '^run ')" = 4 ] || fail "given up: $(count calls '^run ') runs, want 4 (3 tries, then zeropp)"
grep -q "in each of 3 tries .*: giving up on this launch" "$work/err" || fail "given up: not said: $(cat "$work/err")"
grep -q "^- 400mbit, batch 64, rep 1, zero3: ksoftirqd waited more than 5 s on a run queue in each of 3 tries$" "$work/out/cluster_train.md" ||
  fail "given up: the table does not list the run: $(grep '^- ' "$work/out/cluster_train.md")"
grep -q ": 3 launches discarded and run again for more than 5 s .*, 1 launch given up after 3 tries" "$work/out/cluster_train.md" ||
  fail "given up: the table's note: $(grep -i ksoftirqd "$work/out/cluster_train.md")"
bad ZPP_SOFTIRQ_MAX_WAIT_S 0
bad ZPP_SOFTIRQ_TRIES 20
echo "PASS: cluster_train_test.sh" >&2
