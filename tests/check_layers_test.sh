#!/usr/bin/env bash
# tools/check_layers.sh must refuse each kind of violation it names: it is
# run on scratch copies of the tree, each with one violation planted, and
# must fail naming it; on the unchanged copy it must pass.  The symbol
# check runs on two objects compiled here, one calling up a layer.
set -euo pipefail
src=${1:?usage: check_layers_test.sh SOURCE_ROOT}
chk=$src/tools/check_layers.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pass=0 failn=0
fresh() { rm -rf "$work/t"; mkdir -p "$work/t"; cp -r "$src/src" "$src/tools" "$src/perf" "$work/t/"; }
expect_fail() { # name pattern
  local out
  if out=$("$chk" "$work/t" 2>&1); then
    echo "FAIL: $1: the check passed"; failn=$((failn + 1)); return
  fi
  if grep -q -- "$2" <<<"$out"; then
    echo "ok: $1"; pass=$((pass + 1))
  else
    echo "FAIL: $1: the check failed without naming '$2':"; echo "$out"; failn=$((failn + 1))
  fi
}

fresh
if "$chk" "$work/t" > /dev/null; then echo "ok: the unchanged tree passes"; pass=$((pass + 1));
else echo "FAIL: the unchanged tree fails"; "$chk" "$work/t" || true; failn=$((failn + 1)); fi

fresh  # an include of a higher layer
sed -i '0,/#include "/s@#include "@#include "coll/coll.h"\n#include "@' "$work/t/src/transport/transport.c"
expect_fail "upward include" 'layer transport may not include coll'

fresh  # a cycle between two headers of one layer
printf '#include "b.h"\n' > "$work/t/src/core/a.h"
printf '#include "a.h"\n' > "$work/t/src/core/b.h"
expect_fail "include cycle" 'an include cycle'

fresh  # a hand-written prototype in a benchmark
printf 'size_t zpp_engine_cached_bytes(void *comm);\nint main(void) { return 0; }\n' > "$work/t/perf/zpp_planted.c"
expect_fail "hand-written prototype in perf/" 'zpp_planted.c:1'

fresh  # a tool reaching into a layer's private header
printf '#include "engine/plan.h"\n' > "$work/t/tools/planted.c"
expect_fail "private header in tools/" 'tools and perf use'

fresh  # an upward include written with angle brackets
sed -i '0,/#include "/s@#include "@#include <engine/plan.h>\n#include "@' "$work/t/src/transport/transport.c"
expect_fail "upward <...> include" 'layer transport may not include engine'

fresh  # an upward include behind a comment on its line
printf '/* note */ #include "coll/coll.h"\n' >> "$work/t/src/comm/comm.c"
expect_fail "include after a comment" 'layer comm may not include coll'

fresh  # a commented-out include is no include
printf '/* #include "coll/coll.h" */\n// #include "runtime/x.h"\n' >> "$work/t/src/core/log.c"
if "$chk" "$work/t" > /dev/null; then echo "ok: commented-out includes ignored"; pass=$((pass + 1));
else echo "FAIL: a commented-out include was counted"; failn=$((failn + 1)); fi

fresh  # the internal API used to launder an upward include
sed -i '0,/#include "/s@#include "@#include "include/zpp_internal/topo.h"\n#include "@' "$work/t/src/core/log.c"
expect_fail "upward include through zpp_internal" 're-exports layer topology, a layer above core'

fresh  # ... also through a second internal header
printf '#include "planted_b.h"\n' > "$work/t/src/include/zpp_internal/planted_a.h"
printf '#include "../../topology/topo.h"\n' > "$work/t/src/include/zpp_internal/planted_b.h"
sed -i '0,/#include "/s@#include "@#include "include/zpp_internal/planted_a.h"\n#include "@' "$work/t/src/core/log.c"
expect_fail "upward include through two internal headers" 'planted_a.h", which re-exports layer topology'

fresh  # a C++ file of a layer is checked too
printf '#include "runtime/runtime.c"\n' > "$work/t/src/algo/planted.cc"
expect_fail "upward include in a .cc file" 'planted.cc: includes "runtime/runtime.c": layer algo may not include runtime'

fresh  # a prototype with its return type on the line before
printf 'zpp_status_t\nzpp_planted_two_lines(int x);\n' >> "$work/t/src/coll/qwd.c"
expect_fail "two-line hand-written prototype" 'qwd.c:[0-9]*: zpp_planted_two_lines'

fresh  # a computed include
printf '#define HDR "coll/coll.h"\n#include HDR\n' >> "$work/t/src/comm/comm.c"
expect_fail "computed include" 'a computed include'

fresh  # a benchmark in a subfolder reaching into a layer
mkdir -p "$work/t/perf/sub" && printf '#include "engine/plan.h"\n' > "$work/t/perf/sub/x.c"
expect_fail "private header in a perf/ subfolder" 'perf/sub/x.c: includes "engine/plan.h"'

fresh  # a source file outside the layers
printf 'int zpp_planted;\n' > "$work/t/src/planted.c"
expect_fail "file outside the layers" 'lives in a layer'

fresh  # a folder that is no layer
mkdir -p "$work/t/src/misc" && printf 'int zpp_planted2;\n' > "$work/t/src/misc/x.c"
expect_fail "unknown folder" 'not a known layer'

# A gcc that cannot strip comments (clang takes no -fpreprocessed) must
# stop the check, not make every file look empty.
fresh
mkdir -p "$work/bin" && printf '#!/bin/sh\nexit 1\n' > "$work/bin/gcc" && chmod +x "$work/bin/gcc"
if PATH="$work/bin:$PATH" "$chk" "$work/t" > /dev/null 2>&1; then
  echo "FAIL: a broken gcc let the check pass"; failn=$((failn + 1))
else
  rc=0; PATH="$work/bin:$PATH" "$chk" "$work/t" > /dev/null 2>&1 || rc=$?
  if [ $rc = 2 ]; then echo "ok: a broken gcc stops the check"; pass=$((pass + 1));
  else echo "FAIL: a broken gcc gave exit $rc, not 2"; failn=$((failn + 1)); fi
fi

# Symbols: transport calling a function defined in algo.
if command -v cc > /dev/null; then
  fresh
  mkdir -p "$work/o/src/transport" "$work/o/src/algo"
  printf 'void zpp_planted_up(void);\nvoid zpp_t(void) { zpp_planted_up(); }\n' > "$work/o/t.c"
  printf 'void zpp_planted_up(void) {}\n' > "$work/o/a.c"
  cc -c "$work/o/t.c" -o "$work/o/src/transport/t.c.o"
  cc -c "$work/o/a.c" -o "$work/o/src/algo/a.c.o"
  if out=$("$chk" --objects "$work/o" "$work/t" 2>&1); then
    echo "FAIL: upward call: the check passed"; failn=$((failn + 1))
  elif grep -q 'uses zpp_planted_up of layer algo' <<<"$out"; then
    echo "ok: upward call"; pass=$((pass + 1))
  else
    echo "FAIL: upward call not named:"; echo "$out"; failn=$((failn + 1))
  fi
fi
echo "$pass passed, $failn failed"
[ $failn = 0 ]
