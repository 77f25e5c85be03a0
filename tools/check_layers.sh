#!/usr/bin/env bash
# The layer check: libzpp's source is one folder per layer (src/<layer>/),
# and a file may include only headers of its own layer or of a layer below
# it.  Run by `make test` (ctest: layers_check).
#
#   usage: tools/check_layers.sh [--list | --diagram] [--objects DIR] [ROOT]
#     (none)     checks ROOT (default: the tree this script is in); prints
#                every violation and exits 1 when there is one
#     --objects DIR  also checks the compiled objects under DIR (a build's
#                CMakeFiles/zpp_objects.dir): every zpp_ symbol an object
#                uses is defined in its own layer or one below (a call that
#                goes up through a prototype in a lower header is caught
#                here, not by the includes)
#     --list     prints the layers, bottom first, with what each holds
#     --diagram  prints the layer diagram of docs/design.md ("Layers"),
#                which a test compares with the doc
#
# What it refuses:
#   - an include of a higher layer's header ("up"), or of a file that does
#     not exist in the layer named;
#   - an include cycle among the library's headers;
#   - a prototype of a zpp_ function written by hand in a source file (not a
#     header) of src/, tools/ or perf/ (declarations live in the owner's
#     header; tools and perf use <zpp/...> or the declared internal API,
#     src/include/zpp_internal);
#   - a computed include (#include MACRO), which it cannot read (an
#     #include_next or an #include continued on the next line reads as one
#     too: name the header on one line);
#   - in tools/ and perf/: an include of a layer's private header.
# Headers are included by their path below src/ ("transport/transport.h");
# a header of the file's own folder may also be named bare ("quant_cpu.h",
# which the kernels use so that tools can compile them alone).  Comments
# are stripped before the includes are read (gcc -fpreprocessed); <...>
# includes of a layer's header count like "..." ones; a header of
# src/include/zpp_internal counts as the layers it re-exports.
set -euo pipefail

# Bottom first.  A layer may include its own headers and those of every
# layer before it.  name|what it holds (docs/design.md draws from this).
LAYERS=(
  "core|errors, logging, settings, clock"
  "kernels|block quantizer, element-wise kernels: scalar, AVX2, AVX-512, CUDA"
  "quant|the public codec API (zpp_quant_*) over the kernels"
  "topology|node map, ZPP_TOPO emulation, GPU links (NVML)"
  "transport|groups, counters, link emulation, errors; MPI, UCX, NCCL backends"
  "algo|ring, pairwise, hierarchical over rounds; the one transfer dispatch"
  "comm|struct zpp_comm: creation over any bootstrap, subsets, shrinking"
  "engine|plans and the engine that runs them; kernels by memory space"
  "coll|baselines, qwZ, hpZ, qgZ, qWD over one argument check"
  "runtime|parameter groups for ZeRO runtimes (zpp_pgroup_*)"
)

mode=check
objdir=
while [ $# -gt 0 ]; do
  case $1 in
    --list) mode=list; shift ;;
    --diagram) mode=diagram; shift ;;
    --objects)
      [ $# -ge 2 ] || { echo "check_layers.sh: --objects needs a directory" >&2; exit 2; }
      objdir=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "check_layers.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ -n "$objdir" ]; then
  [ -d "$objdir/src" ] || { echo "check_layers.sh: --objects '$objdir': no src/ of objects there (give a build's CMakeFiles/zpp_objects.dir)" >&2; exit 2; }
  objdir=$(cd "$objdir" && pwd)
fi
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
[ -d "$root/src" ] || { echo "check_layers.sh: no src/ under '$root'" >&2; exit 2; }

declare -A rank
names=()
for i in "${!LAYERS[@]}"; do
  n=${LAYERS[$i]%%|*}
  rank[$n]=$i
  names+=("$n")
done

if [ $mode = list ]; then
  for i in "${!LAYERS[@]}"; do
    printf '%2d  src/%-10s %s\n' "$i" "${LAYERS[$i]%%|*}/" "${LAYERS[$i]#*|}"
  done
  exit 0
fi
if [ $mode = diagram ]; then
  # Top first, as a stack: each layer uses only what is drawn below it.
  printf '%-15s %s\n' "src/include/" "zpp_internal/: the declared internal API of tools/, perf/"
  for ((i = ${#LAYERS[@]} - 1; i >= 0; i--)); do
    printf '%-15s %s\n' "src/${LAYERS[$i]%%|*}/" "${LAYERS[$i]#*|}"
    [ $i -gt 0 ] && echo "   |" || true
  done
  exit 0
fi

fail=0
bad() { echo "check_layers: $*"; fail=1; }

# gcc strips the comments before the includes are read; a compiler that
# does not (clang takes no -fpreprocessed) would make every file look
# empty and the check pass: refuse to run instead.
probe=$(printf '/**/ #include "a/b.h"\n// #include "c/d.h"\n' |
        gcc -fpreprocessed -dD -E -P -x c - 2>/dev/null | tr -d ' \n') || probe=
[ "$probe" = '#include"a/b.h"' ] ||
  { echo "check_layers.sh: 'gcc -fpreprocessed' does not strip comments here (gcc missing, or not GNU gcc)" >&2; exit 2; }
cd "$root"
# Every folder of src/ is a layer (or the declared internal API).
for d in src/*/; do
  d=${d%/}; d=${d#src/}
  [ "$d" = include ] && continue
  [ -n "${rank[$d]:-}" ] || bad "src/$d/ is not a known layer (add it to LAYERS in tools/check_layers.sh)"
done
for f in src/*.c src/*.h; do
  [ -e "$f" ] && bad "$f: every source file lives in a layer's folder"
done

edges=$(mktemp)
trap 'rm -f "$edges"' EXIT
# The include directives of a file, comments stripped first (so neither a
# commented-out include counts nor a comment hides one), one a line:
# "q PATH" ("..."), "a PATH" (<...>) or "x TEXT" (a computed include).
includes_of() { # file
  local txt
  if ! txt=$(gcc -fpreprocessed -dD -E -P -x c "$1" 2>&1); then
    echo "e gcc -fpreprocessed failed: ${txt%%$'\n'*}"
    return 0
  fi
  printf '%s\n' "$txt" |
    sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/q \1/p;
             t;
             s/^[[:space:]]*#[[:space:]]*include[[:space:]]*<([^>]+)>.*/a \1/p;
             t;
             s/^[[:space:]]*#[[:space:]]*include[[:space:]]*(.*)$/x \1/p'
}
# The highest layer a header of src/include/zpp_internal re-exports, as a
# rank (-1: none): its includes by relative path, "..." or <...>, followed
# through other zpp_internal headers; each is an edge of the include
# graph, so a cycle through the internal API is seen too.
internal_rank() { # src/include/... file [depth]
  local f=$1 depth=${2:-0} r=-1 kind inc path tgt sub
  [ "$depth" -gt 8 ] && { echo 99; return; } # a loop: the cycle check names it
  while read -r kind inc; do
    case $kind in q|a) ;; *) continue ;; esac
    path=$(realpath -m --relative-to=. "$(dirname "$f")/$inc")
    [ -e "$path" ] || continue # a system header named <...>
    echo "$f $path" >> "$edges"
    case $path in
      src/include/*) sub=$(internal_rank "$path" $((depth + 1))) ;;
      src/*) tgt=${path#src/}; tgt=${tgt%%/*}; sub=${rank[$tgt]:--1} ;;
      *) sub=-1 ;;
    esac
    [ "$sub" -gt "$r" ] && r=$sub
  done < <(includes_of "$f")
  echo "$r"
}
check_file() { # file layer
  local f=$1 me=$2 kind inc tgt r
  while read -r kind inc; do
    if [ "$kind" = e ]; then
      bad "$f: $inc"
      continue
    fi
    if [ "$kind" = x ]; then
      bad "$f: a computed include ($inc): name the header"
      continue
    fi
    if [[ $inc != */* ]]; then
      [ "$kind" = a ] && continue # a system header
      [ -e "$(dirname "$f")/$inc" ] || bad "$f: includes \"$inc\", which is not in its folder"
      echo "$f $(dirname "$f")/$inc" >> "$edges"
      continue
    fi
    tgt=${inc%%/*}
    if [ "$tgt" = include ]; then
      if [ ! -e "src/$inc" ]; then
        bad "$f: includes \"$inc\", which does not exist"
        continue
      fi
      echo "$f src/$inc" >> "$edges"
      r=$(internal_rank "src/$inc")
      if [ "$r" -ge ${#names[@]} ]; then
        bad "$f: includes \"$inc\", whose includes loop"
      elif [ "$r" -gt "${rank[$me]}" ]; then
        bad "$f: includes \"$inc\", which re-exports layer ${names[$r]}, a layer above $me"
      fi
      continue
    fi
    if [ -z "${rank[$tgt]:-}" ]; then
      # <zpp/...>, <sys/...>: public and system headers; "x/y.h": no layer
      [ "$kind" = q ] && bad "$f: includes \"$inc\": '$tgt' is not a layer"
      continue
    fi
    [ -e "src/$inc" ] || bad "$f: includes \"$inc\", which does not exist"
    if [ "${rank[$tgt]}" -gt "${rank[$me]}" ]; then
      bad "$f: includes \"$inc\": layer $me may not include $tgt, a layer above it"
    fi
    echo "$f src/$inc" >> "$edges"
  done < <(includes_of "$f")
}
# A hand-written prototype: a file-scope declaration of a zpp_ function
# ending in ");", its return type on the same line (not static) or on the
# line before (a line that starts with the name).
hand_protos() { # file
  awk '
    function check(line) {
      decl = line; start = FNR
      while (decl !~ /[;{]/ && (getline nxt) > 0) decl = decl " " nxt
      if (decl ~ /\)[ \t]*(__attribute__.*)?;[ \t]*$/) print FILENAME ":" start ": " line
    }
    /^[A-Za-z_][A-Za-z0-9_ \t\*]*[ \t\*]zpp_[A-Za-z0-9_]+[ \t]*\(/ && $1 != "static" { check($0); next }
    /^zpp_[A-Za-z0-9_]+[ \t]*\(/ && prev !~ /^static/ { check($0); next }
    { prev = $0 }' "$1"
}
# Source files of every kind: C, CUDA, C++.
SRC_FIND=(-type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh'
          -o -name '*.cc' -o -name '*.cpp' -o -name '*.hpp' \))

for n in "${names[@]}"; do
  [ -d "src/$n" ] || continue
  while IFS= read -r f; do
    check_file "$f" "$n"
    case $f in
      *.h|*.cuh|*.hpp) ;;
      *)
        while IFS= read -r p; do
          bad "$p (a prototype belongs in its owner's header)"
        done < <(hand_protos "$f") ;;
    esac
  done < <(find "src/$n" "${SRC_FIND[@]}" | sort)
done

# The declared internal API includes only public headers and the
# self-contained headers it re-exports (by relative path).
while IFS= read -r f; do
  while read -r kind inc; do
    [ "$kind" = e ] && bad "$f: $inc"
    [ "$kind" = q ] || continue
    [ -e "$(dirname "$f")/$inc" ] || bad "$f: includes \"$inc\", which does not exist"
  done < <(includes_of "$f")
done < <(find src/include "${SRC_FIND[@]}" 2>/dev/null | sort)

# Tools and benchmarks: the public API or src/include/zpp_internal only.
while IFS= read -r f; do
  while read -r kind inc; do
    if [ "$kind" = e ]; then
      bad "$f: $inc"
      continue
    fi
    if [ "$kind" = x ]; then
      bad "$f: a computed include ($inc): name the header"
      continue
    fi
    tgt=${inc%%/*}
    case $kind:$inc in
      *:zpp_internal/*) [ -e "src/include/$inc" ] || bad "$f: includes \"$inc\", which does not exist" ;;
      a:*/*) [ -n "${rank[$tgt]:-}" ] && bad "$f: includes <$inc>: tools and perf use <zpp/...> or zpp_internal/" ;;
      q:*/*) bad "$f: includes \"$inc\": tools and perf use <zpp/...> or zpp_internal/" ;;
      q:*) [ -e "$(dirname "$f")/$inc" ] || bad "$f: includes \"$inc\": not a header of its folder (tools and perf use <zpp/...> or zpp_internal/)" ;;
    esac
  done < <(includes_of "$f")
  case $f in
    *.h|*.cuh|*.hpp) ;;
    *)
      while IFS= read -r p; do
        bad "$p (declare it in src/include/zpp_internal, not by hand)"
      done < <(hand_protos "$f") ;;
  esac
done < <(find tools perf "${SRC_FIND[@]}" | sort)

# No include cycle among the library's files.
if [ -s "$edges" ] && ! tsort "$edges" > /dev/null 2> "$edges.err"; then
  bad "an include cycle: $(grep -v 'input contains a loop' "$edges.err" | sed 's/^tsort: //' | tr '\n' ' ')"
fi
rm -f "$edges.err"

# Symbols: what each layer's objects define, and what they use.
nobj=0
if [ -n "$objdir" ]; then
  declare -A owner
  for n in "${names[@]}"; do
    [ -d "$objdir/src/$n" ] || continue
    for o in "$objdir/src/$n"/*.o; do
      [ -e "$o" ] || continue
      nobj=$((nobj + 1))
      while read -r sym; do
        owner[$sym]=$n
      done < <(nm --defined-only -g "$o" | awk '$3 ~ /^zpp_/ {print $3}')
    done
  done
  for n in "${names[@]}"; do
    [ -d "$objdir/src/$n" ] || continue
    for o in "$objdir/src/$n"/*.o; do
      [ -e "$o" ] || continue
      while read -r sym; do
        o_layer=${owner[$sym]:-}
        [ -n "$o_layer" ] || continue
        if [ "${rank[$o_layer]}" -gt "${rank[$n]}" ]; then
          bad "src/$n/$(basename "${o%.o}") uses $sym of layer $o_layer, a layer above it"
        fi
      done < <(nm -u "$o" | awk '$2 ~ /^zpp_/ {print $2}')
    done
  done
  [ $nobj -gt 0 ] || bad "--objects '$objdir': no object files under src/"
fi

if [ $fail = 0 ]; then
  [ -n "$objdir" ] && echo "check_layers: $nobj objects: no call into a layer above"
  echo "check_layers: ${#names[@]} layers, bottom first: ${names[*]}; no upward include, no cycle, no hand-written prototype"
fi
exit $fail
