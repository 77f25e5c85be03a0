#!/usr/bin/env bash
# perf/gloo_peer_study.sh without a cluster, on a copy of its scripts
# (perf/gloo_peer_study.sh, gloo_peer.py, gloo_peer_table.py,
# scripts/softirq_wait.sh) whose scripts/netns_cluster.sh is a stand-in
# (logs up, shape, down and every run with its paths made absolute; a run
# prints CSV rows for the sizes and label it was given and exits with the
# status FAKE_RC_<launch number> names) and whose .venv-torch/bin/python
# is python3 (taking any -c as the import check):
#   1. bad settings are refused by name (exit 2) before anything touches
#      the cluster or OUT_DIR: a layout, a rate, a size, a size twice, a
#      (layout, size) pair whose elements are no multiple of the ranks,
#      REPS, the timeout;
#   2. 2 layouts x 2 rates x 2 sizes: one launch per (layout, rate, size),
#      each with that one size; a launch that exits 3 (a wrong output)
#      keeps its rows and the study exits 1; one that exits 1 loses them;
#   3. every command printed above the tables, run as shown from the
#      copy's root, makes the very launch the study made.
# usage: gloo_peer_study_test.sh SOURCE_DIR
set -euo pipefail
src=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
root=$work/src
mkdir -p "$root/perf" "$root/scripts" "$root/python" "$root/.venv-torch/bin" "$root/build" "$work/proc"
cp "$src/perf/gloo_peer_study.sh" "$src/perf/gloo_peer.py" "$src/perf/gloo_peer_table.py" "$root/perf/"
cp "$src/scripts/softirq_wait.sh" "$root/scripts/"
: > "$root/build/libzpp.so"
cat > "$root/.venv-torch/bin/python" <<'EOF'
#!/usr/bin/env bash
[ "${1:-}" = -c ] && exit 0
exec python3 "$@"
EOF
cat > "$root/scripts/netns_cluster.sh" <<EOF
#!/usr/bin/env bash
# stand-in scripts/netns_cluster.sh
log=$work/calls
case \$1 in
  check) exit 0 ;;
  up|shape|down) echo "\$*" >> "\$log"; exit 0 ;;
  run) ;;
  *) echo "stand-in: \$1?" >&2; exit 1 ;;
esac
shift
n=\$(( \$(cat $work/nrun 2> /dev/null || echo 0) + 1 ))
echo \$n > $work/nrun
line="run"
sizes= label= reps=
for a in "\$@"; do
  v=\$a
  case \$a in
    *=*) k=\${a%%=*}; p=\${a#*=}; [ -e "\$p" ] && v="\$k=\$(realpath "\$p")" ;;
    *) [ -e "\$a" ] && v=\$(realpath "\$a") ;;
  esac
  line+=" \$v"
done
echo "\$line" >> "$work/runs"
while [ \$# -gt 0 ]; do
  case \$1 in
    --sizes) sizes=\$2; shift ;;
    --label) label=\$2; shift ;;
    --reps) reps=\$2; shift ;;
  esac
  shift
done
case \$sizes in *K) b=\$(( \${sizes%K} << 10 )) ;; *M) b=\$(( \${sizes%M} << 20 )) ;; *) b=\$sizes ;; esac
rc_var=FAKE_RC_\$n
rc=\${!rc_var:-0}
for coll in allgather reducescatter; do
  for v in gloo-bf16 zpp-bf16 gloo-fp32 zpp-qwz8; do
    for ((r = 1; r <= reps; r++)); do
      wrong=0; [ "\$rc" = 3 ] && [ \$r = 1 ] && [ \$v = zpp-bf16 ] && wrong=1
      link=; [ "\${v%%-*}" = zpp ] && link=1000
      echo "\$label,\$coll,\$v,impl,call,bf16,\$b,\$((b / 2)),4,2,\$r,\$((1000 + n * 10 + r)).0,\$wrong,10,0.5,\$link"
    done
  done
done
exit \$rc
EOF
chmod +x "$root/.venv-torch/bin/python" "$root/scripts/netns_cluster.sh"
study=$root/perf/gloo_peer_study.sh
export ZPP_GLOO_STUDY_LOCK=$work/lock ZPP_SOFTIRQ_PROC=$work/proc

# ---- 1. refusals ------------------------------------------------------------
expect() {  # expect EXIT_CODE TEXT -- command...
  local code=$1 text=$2 rc=0 out
  shift 3
  out=$("$@" 2>&1) || rc=$?
  [ "$rc" = "$code" ] || fail "$*: exit $rc, wanted $code ($out)"
  [[ "$out" == *"$text"* ]] || fail "$*: '$out' does not say '$text'"
}
refuse() {  # refuse TEXT VAR=VALUE...
  local text=$1
  shift
  expect 2 "$text" -- env "$@" bash "$study" "$work/o1" "$root/build"
}
expect 2 "usage" -- bash "$study"
refuse "LAYOUTS: '3x2'" ZPP_GLOO_STUDY_LAYOUTS=3x2
refuse "LAYOUTS: '2x17'" ZPP_GLOO_STUDY_LAYOUTS="2x2 2x17"
refuse "rate 'fast'" ZPP_GLOO_STUDY_RATES=fast
refuse "size '100'" ZPP_GLOO_STUDY_SIZES=100
refuse "size '32K': must be at least 64K" ZPP_GLOO_STUDY_SIZES=32K
refuse "size '1024K': the size of '1M' again" ZPP_GLOO_STUDY_SIZES="1M 64K 1024K"
refuse "size '64K' with layout '2x3': 32768 bf16 elements are not a multiple of its 6 ranks" \
  ZPP_GLOO_STUDY_LAYOUTS="2x2 2x3" ZPP_GLOO_STUDY_SIZES="64K"
refuse "REPS '0'" ZPP_GLOO_STUDY_REPS=0
refuse "TIMEOUT_S 'x'" ZPP_GLOO_STUDY_TIMEOUT_S=x
[ ! -e "$work/calls" ] && [ ! -e "$work/runs" ] || fail "a refused study touched the cluster: $(cat "$work/calls" "$work/runs" 2> /dev/null)"
[ ! -e "$work/o1" ] || fail "a refused study made OUT_DIR"
echo "refusals: ok"

# ---- 2. one launch per (layout, rate, size); exit 3 keeps the rows ----------
rc=0
(cd "$work" && env ZPP_GLOO_STUDY_LAYOUTS="2x2 2x1" ZPP_GLOO_STUDY_RATES="400mbit none" \
  ZPP_GLOO_STUDY_SIZES="64K 128K" ZPP_GLOO_STUDY_REPS=2 FAKE_RC_3=3 FAKE_RC_6=1 \
  bash "$study" "$work/out" "$root/build") > "$work/study.log" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "study exit $rc, wanted 1: $(cat "$work/study.log")"
grep -q "exit 3 (2x2, none, 64K): a wrong output" "$work/study.log" || fail "exit 3 not named: $(cat "$work/study.log")"
grep -q "exit 1 (2x1, 400mbit, 128K" "$work/study.log" || fail "exit 1 not named: $(cat "$work/study.log")"
[ "$(wc -l < "$work/runs")" = 8 ] || fail "$(wc -l < "$work/runs") launches, wanted 8: $(cat "$work/runs")"
i=0
for l in 2x2 2x1; do
  for r in 400mbit none; do
    for s in 64K 128K; do
      i=$((i + 1))
      want="--sizes $s --reps 2 --label $l,$r"
      line=$(sed -n "${i}p" "$work/runs")
      [[ "$line" == *" $want" ]] || fail "launch $i: '$line' does not end in '$want'"
      [[ "$line" == "run -np $((2 * ${l#2x})) "* ]] || fail "launch $i: '$line'"
    done
  done
done
csv=$work/out/gloo_peer_study.csv
# 7 launches kept (the 6th failed) x 2 colls x 4 variants x 2 reps
[ "$(($(wc -l < "$csv") - 1))" = $((7 * 16)) ] || fail "$(wc -l < "$csv") lines in the CSV"
grep -q "^2x2,none,allgather,zpp-bf16,impl,call,bf16,65536,32768,4,2,1,1031.0,1," "$csv" ||
  fail "the rows of the launch that exited 3 are not kept"
! grep -q "^2x1,400mbit,.*,131072," "$csv" || fail "the rows of the failed launch are kept"
md=$work/out/gloo_peer_study.md
[ -s "$md" ] || fail "no table"
echo "launches: ok"

# ---- 3. the printed commands rerun as shown ---------------------------------
mapfile -t shown < <(grep -o '^`scripts/netns_cluster.sh run [^`]*`' "$md" | tr -d '`')
[ "${#shown[@]}" = 8 ] || fail "${#shown[@]} run commands in the table, wanted 8: $(cat "$md")"
grep -q '^`scripts/netns_cluster.sh up -n 2 -p 1 -r 400mbit`' "$md" || fail "no up command: $(cat "$md")"
cp "$work/runs" "$work/runs.study"
rm -f "$work/runs"
for c in "${shown[@]}"; do
  [[ "$c" != *"$work"* ]] || fail "an absolute path in '$c'"
  (cd "$root" && eval "$c") > /dev/null || true
done
cmp "$work/runs" "$work/runs.study" ||
  fail "the printed commands ran other launches: $(diff "$work/runs.study" "$work/runs")"
echo "commands: ok"
