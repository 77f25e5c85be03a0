#!/usr/bin/env bash
# The register check of the CUDA kernels: reads ptxas's resource report
# (-Xptxas -v) of each CUDA file for each GPU architecture the library is
# built for, from a compile of its own or from the library's build
# (--logs), and fails when any function spills registers or uses local
# memory, printing the function, the architecture and ptxas's numbers.  A
# spill or a stack frame puts a kernel's working set in local memory (device memory behind L1): the kernels of
# src/kernels are written to keep theirs in registers and shared memory.
# Run by `make test` (ctest: ptxas_check) wherever nvcc is found.
#
#   usage: tools/check_ptxas.sh [--nvcc PATH] [--arch ARCH] FILE.cu...
#                               [-- NVCC_ARGS...]
#          tools/check_ptxas.sh --logs DIR [--arch ARCH] FILE.cu...
#     --nvcc PATH  the compiler (default: $NVCC, else nvcc on PATH, else
#                  /usr/local/cuda/bin/nvcc)
#     --arch ARCH  an architecture ptxas compiles for (sm_80); repeat it or
#                  give a comma-separated list for several (default
#                  sm_80,sm_90: the machine code of CMakeLists.txt's
#                  default CUDA architectures)
#     --logs DIR   compile nothing: read the reports the library's own CUDA
#                  build saved (tools/ptxas_log.sh, one per source it
#                  compiled successfully, with the source's hash and the
#                  architectures); a FILE.cu without its report, a report
#                  older than the file (its hash differs: rebuild), an ARCH
#                  the build did not compile for, or a file with __global__
#                  functions and no kernel in the report is an error (2).
#                  The hash covers the file, not the headers it includes:
#                  run it after the build (make test does)
#     ZPP_PTXAS_JOBS  compilations at a time (default: the processors)
#     NVCC_ARGS    given to nvcc after the defaults (-std=c++17 and the
#                  IEEE flags of the library's CUDA build): include
#                  directories, definitions
#
# What it refuses, per function (kernels and device functions ptxas
# reports on their own):
#   - "N bytes spill stores" or "N bytes spill loads" with N > 0;
#   - "N bytes stack frame" with N > 0 (a local array indexed at run time,
#     a call that is not inlined) and "N bytes lmem" with N > 0.
# A file without kernels or device functions (host code only: ptxas
# reports no function) passes as "no kernels".
# Exit status: 0 clean, 1 a function refused, 2 a usage or compile error
# (every file and architecture is checked before a status 1).
set -euo pipefail

nvcc=${NVCC:-}
logs=
archs=()
files=()
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --nvcc)
      [ $# -ge 2 ] || { echo "check_ptxas.sh: --nvcc needs a path" >&2; exit 2; }
      nvcc=$2; shift 2 ;;
    --logs)
      [ $# -ge 2 ] || { echo "check_ptxas.sh: --logs needs a directory" >&2; exit 2; }
      logs=$2; shift 2 ;;
    --arch)
      [ $# -ge 2 ] || { echo "check_ptxas.sh: --arch needs an architecture (sm_90)" >&2; exit 2; }
      IFS=, read -r -a more <<<"$2"
      archs+=("${more[@]}"); shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    -*) echo "check_ptxas.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) files+=("$1"); shift ;;
  esac
done
if [ -z "$logs" ]; then
  if [ -z "$nvcc" ]; then
    nvcc=$(command -v nvcc || true)
    [ -n "$nvcc" ] || nvcc=/usr/local/cuda/bin/nvcc
  fi
  [ -x "$nvcc" ] || { echo "check_ptxas.sh: no nvcc at '$nvcc'" >&2; exit 2; }
fi
[ ${#files[@]} -gt 0 ] || { echo "check_ptxas.sh: no CUDA file given (see --help)" >&2; exit 2; }
[ ${#archs[@]} -gt 0 ] || archs=(sm_80 sm_90)
demangle() { if command -v c++filt > /dev/null; then c++filt; else cat; fi; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bad=0
for f in "${files[@]}"; do
  [ -f "$f" ] || { echo "check_ptxas.sh: no file '$f'" >&2; exit 2; }
done
if [ -n "$logs" ]; then
  # The build's reports (tools/ptxas_log.sh): a header line with the
  # source's hash and the architectures compiled, then every
  # architecture's ptxas run in turn, each opening with its "bytes gmem"
  # line and naming its architecture in "Compiling entry function '...'
  # for 'sm_NN'".  Refused: a missing report, one whose hash is not the
  # source's (not rebuilt since the source changed), an --arch the build
  # did not compile for.  Split into one log per (architecture, file),
  # numbered as the compile mode numbers them.
  [ -d "$logs" ] || { echo "check_ptxas.sh: no log directory '$logs'" >&2; exit 2; }
  if [ -n "$nvcc" ] || [ ${#extra[@]} -gt 0 ]; then
    echo "check_ptxas.sh: --logs compiles nothing: --nvcc and NVCC_ARGS do not apply" >&2
    exit 2
  fi
  fi_=0
  for f in "${files[@]}"; do
    fi_=$((fi_ + 1))
    abs=$(realpath "$f")
    log=$logs/$(tr / _ <<<"$abs").log
    if [ ! -f "$log" ]; then
      echo "check_ptxas.sh: no ptxas report '$log' for $f (is it one of the" \
        "library's CUDA sources, built with tools/ptxas_log.sh? A report removed" \
        "after the build comes back when the file is compiled again)" >&2
      exit 2
    fi
    read -r head < "$log"
    sum=$(sed -n 's/.* sha256=\([0-9a-f]*\).*/\1/p' <<<"$head")
    built=$(sed -n 's/.* archs=\([^ ]*\).*/\1/p' <<<"$head")
    if [[ "$head" != "# ptxas_log source=$abs "* ]] || [ -z "$sum" ]; then
      echo "check_ptxas.sh: $log has no header of tools/ptxas_log.sh for $abs" >&2
      exit 2
    fi
    if [ "$sum" != "$(sha256sum < "$abs" | cut -d' ' -f1)" ]; then
      echo "check_ptxas.sh: $log is older than $f (rebuild the library)" >&2
      exit 2
    fi
    awk -v out="$work/sec$fi_" '
      NR == 1 { next }
      /bytes gmem/ { n++ }
      { sec[n] = sec[n] $0 "\n" }
      /Compiling entry function .* for / && !(n in arch) {
        a = $NF; gsub(/\047/, "", a); arch[n] = a
      }
      END { for (i in arch) printf "%s", sec[i] > (out "." arch[i]) }
    ' "$log"
    kernels=$(grep -c "Compiling entry function" "$log" || true)
    k=0
    for arch in "${archs[@]}"; do
      for g in "${files[@]}"; do
        k=$((k + 1))
        [ "$g" = "$f" ] || continue
        echo 0 > "$work/rc$k"
        case ",$built," in
          *",$arch,"*) ;;
          *) echo "check_ptxas.sh: $f was built for '${built:-no architecture}', not $arch" \
               "(the build's CUDA architectures and --arch differ)" >&2
             exit 2 ;;
        esac
        if [ -f "$work/sec$fi_.$arch" ]; then
          cp "$work/sec$fi_.$arch" "$work/log$k"
        elif [ "$kernels" -eq 0 ] && ! grep -q '__global__' "$abs"; then
          echo "ptxas info    : no kernels" > "$work/log$k"
        else
          echo "check_ptxas.sh: $log has no ptxas report on $f's kernels for $arch" >&2
          exit 2
        fi
      done
    done
  done
else
  # Every (architecture, file) compiled first, ZPP_PTXAS_JOBS at a time
  # (default: the processors), each into a log of its own; then read.
  jobs=${ZPP_PTXAS_JOBS:-$(nproc 2> /dev/null || echo 2)}
  k=0
  for arch in "${archs[@]}"; do
    for f in "${files[@]}"; do
      k=$((k + 1))
      while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
      ( "$nvcc" -arch="$arch" -std=c++17 --fmad=false -prec-div=true -ftz=false \
          -Xptxas -v -c "$f" -o "$work/out$k.o" "${extra[@]}" > "$work/log$k" 2>&1
        echo $? > "$work/rc$k" ) &
    done
  done
  wait
fi
k=0
for arch in "${archs[@]}"; do
  for f in "${files[@]}"; do
    k=$((k + 1))
    cp "$work/log$k" "$work/log"
    if [ "$(cat "$work/rc$k" 2> /dev/null || echo 1)" != 0 ]; then
      echo "check_ptxas.sh: $f does not compile for $arch:" >&2
      cat "$work/log" >&2
      exit 2
    fi
    # One line per function: name, stack frame, spill stores, spill loads,
    # lmem, registers (ptxas prints the properties line after the name and
    # the register line after that).
    awk '
      /Function properties for / { flush(); name = $NF; have = 1; next }
      /bytes stack frame/ {
        for (i = 1; i <= NF; i++) {
          if ($(i + 1) == "bytes" && $(i + 2) == "stack") frame = $i
          if ($(i + 1) == "bytes" && $(i + 2) == "spill" && $(i + 3) ~ /^stores/) st = $i
          if ($(i + 1) == "bytes" && $(i + 2) == "spill" && $(i + 3) ~ /^loads/) ld = $i
        }
        next
      }
      /Used [0-9]+ registers/ {
        for (i = 1; i <= NF; i++) {
          if ($i == "Used") regs = $(i + 1)
          if ($(i + 1) == "bytes" && $(i + 2) ~ /^lmem/) lmem = $i
        }
        next
      }
      function flush() {
        if (have) print name, frame + 0, st + 0, ld + 0, lmem + 0, regs + 0
        have = 0; frame = st = ld = lmem = regs = 0
      }
      END { flush() }
    ' "$work/log" > "$work/funcs"
    n=$(wc -l < "$work/funcs")
    if [ "$n" -eq 0 ]; then
      # ptxas -v speaks ("ptxas info") even for a file of host code only
      if ! grep -q 'ptxas info' "$work/log"; then
        echo "check_ptxas.sh: $f: no report from ptxas (is -Xptxas -v honoured?)" >&2
        exit 2
      fi
      echo "$f: no kernels for $arch"
      continue
    fi
    fbad=0
    while read -r name frame st ld lmem regs; do
      if [ "$frame" -gt 0 ] || [ "$st" -gt 0 ] || [ "$ld" -gt 0 ] || [ "$lmem" -gt 0 ]; then
        echo "$f: $(demangle <<<"$name"): $frame bytes stack frame, $st bytes spill stores," \
          "$ld bytes spill loads, $lmem bytes lmem ($regs registers, $arch)"
        fbad=$((fbad + 1))
      fi
    done < "$work/funcs"
    maxr=$(awk 'BEGIN { m = 0 } $6 > m { m = $6 } END { print m }' "$work/funcs")
    if [ "$fbad" -eq 0 ]; then
      echo "$f: $n functions for $arch, no spill, no local memory (at most $maxr registers)"
    else
      echo "$f: $fbad of $n functions spill or use local memory ($arch)"
      bad=1
    fi
  done
done
exit $bad
