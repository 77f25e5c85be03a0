/*
 * libFuzzer target: what tools/zpp_quant_error.c still reads from outside,
 * on arbitrary bytes: a raw file (no header: formats with one are read by
 * the Python front end through numpy, safetensors and torch) measured
 * under the flags that change the arithmetic (--hadamard, --dtype,
 * --rounding, --decode-to), and its command line.
 *
 * The tool is compiled in here as it is: its main is renamed, and the
 * macros below give it a way out that returns to the fuzzer instead of
 * ending the process.  exit() (the tool's only way out, in qe_fail) jumps
 * back here; the memory and FILEs the tool had open then are released by
 * this file, which tracks malloc/realloc/free and fopen/fclose of the
 * tool's code.  The file the tool opens is the fuzz input itself
 * (fmemopen): nothing touches the file system.
 *
 * Input: bit 0 of byte 0 selects the command line (1; the rest of the
 * input is the arguments, separated by NUL bytes) or a raw file (0; the
 * rest is the file): then bits 1..2 give its --input-dtype (0 fp32,
 * 1 fp16, 2 bf16, 3 fp32), and bits 3..6 add --hadamard 0,32, --dtype
 * bf16 (fp16 for bf16 files), --rounding nearest,stochastic and
 * --decode-to fp32.
 *
 * What must hold: no sanitizer report, an input the tool accepts
 * measures without a library error (exit status 1 would mean the reader
 * passed the library something it rejects), and a run that returns
 * (no exit) frees every block it allocated.
 */
/* Every header the tool includes, before the macros below rename
 * anything in them. */
#include <zpp/zpp.h>

#include "kernels/quant_math.h"

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

/* ---- the harness's side of the macros (real functions) ------------------- */

static jmp_buf qf_jump;
static int qf_armed, qf_status;
static const uint8_t *qf_data;
static size_t qf_size;
static FILE *qf_null, *qf_err;

/* Inputs run, and those the tool read and measured to the end without
 * an exit (run.sh requires some among the committed inputs: with a fixed
 * command line the tool no longer takes, every input would stop at the
 * argument parser and the reader would never run). */
static unsigned long qf_inputs, qf_accepted;

static void qf_summary(void) {
  fprintf(qf_err, "fuzz_quant_error: %lu inputs, %lu accepted\n", qf_inputs,
          qf_accepted);
}

static void **qf_ptrs; /* live blocks of the tool */
static size_t qf_nptrs, qf_cap;
static FILE *qf_files[16];

static void qf_track(void *p) {
  if (p == NULL)
    return;
  if (qf_nptrs == qf_cap) {
    size_t cap = qf_cap ? 2 * qf_cap : 256;
    void **grown = realloc(qf_ptrs, cap * sizeof *grown);
    if (grown == NULL)
      abort(); /* the harness itself: not a finding about the tool */
    qf_ptrs = grown;
    qf_cap = cap;
  }
  qf_ptrs[qf_nptrs++] = p;
}

static void qf_untrack(void *p) {
  size_t i;
  for (i = qf_nptrs; i-- > 0;)
    if (qf_ptrs[i] == p) {
      qf_ptrs[i] = qf_ptrs[--qf_nptrs];
      return;
    }
}

static void *qf_malloc(size_t n) {
  void *p = malloc(n);
  qf_track(p);
  return p;
}

static void *qf_realloc(void *old, size_t n) {
  void *p = realloc(old, n);
  if (p != NULL) {
    qf_untrack(old);
    qf_track(p);
  }
  return p;
}

static void qf_free(void *p) {
  qf_untrack(p);
  free(p);
}

static FILE *qf_fopen(const char *path, const char *mode) {
  FILE *f;
  size_t i;
  (void)path;
  (void)mode;
  if (qf_size == 0)
    return NULL; /* fmemopen needs a byte; the tool reports "cannot open" */
  f = fmemopen((void *)qf_data, qf_size, "rb");
  for (i = 0; f != NULL && i < 16; i++)
    if (qf_files[i] == NULL) {
      qf_files[i] = f;
      break;
    }
  return f;
}

static int qf_fclose(FILE *f) {
  size_t i;
  for (i = 0; i < 16; i++)
    if (qf_files[i] == f)
      qf_files[i] = NULL;
  return fclose(f);
}

static void qf_exit(int code) __attribute__((noreturn));
static void qf_exit(int code) {
  if (!qf_armed)
    abort();
  qf_status = code;
  longjmp(qf_jump, 1);
}

static void qf_release(void) {
  size_t i;
  for (i = 0; i < qf_nptrs; i++)
    free(qf_ptrs[i]);
  qf_nptrs = 0;
  for (i = 0; i < 16; i++)
    if (qf_files[i] != NULL) {
      fclose(qf_files[i]);
      qf_files[i] = NULL;
    }
}

/* ---- the tool, with its way out redirected ------------------------------- */

#undef stderr
#undef stdout
#define stderr qf_null
#define stdout qf_null
#define malloc qf_malloc
#define realloc qf_realloc
#define free qf_free
#define fopen qf_fopen
#define fclose qf_fclose
#define exit qf_exit
#define main zpp_quant_error_main
#include "../../tools/zpp_quant_error.c"
#undef main
#undef exit
#undef fclose
#undef fopen
#undef free
#undef realloc
#undef malloc
#undef stdout
#undef stderr

/* ---- the entry point ---------------------------------------------------- */

static void run(unsigned sel) {
  static const char *const dtypes[] = {"fp32", "fp16", "bf16"};
  int dt = (int)(((sel >> 1) & 3u) % 3u);
  /* one cheap configuration (block 64, INT4 symmetric) and the flags of
   * the selector byte */
  char *argv[24] = {"zpp-quant-error", "--input", "fuzz.bin",
                    "--input-dtype", (char *)dtypes[dt], "--bits", "4",
                    "--block", "64", "--sym"};
  int argc = 10;
  qe_opts_t o;
  qe_rows_t rows = {NULL, 0, 0};
  qe_tensor_t t;
  if (sel & 8) {
    argv[argc++] = "--hadamard";
    argv[argc++] = "0,32";
  }
  if (sel & 16) {
    argv[argc++] = "--dtype";
    argv[argc++] = dt == 2 ? "fp16" : "bf16";
  }
  if (sel & 32) {
    argv[argc++] = "--rounding";
    argv[argc++] = "nearest,stochastic";
  }
  if (sel & 64) {
    argv[argc++] = "--decode-to";
    argv[argc++] = "fp32";
  }
  qe_parse_args(argc, argv, &o);
  memset(&t, 0, sizeof t);
  qe_read_raw(&o, &t);
  if (o.dtype >= 0)
    qe_tensor_convert(&t, o.dtype);
  qe_measure_all(&o, &t, &rows);
  qe_tensor_free(&t);
  qe_print(&o, &rows, qf_null); /* rows point at the name in argv */
  qf_free(rows.rows);
  qf_accepted++; /* no exit on the way */
  /* qf_release frees what an exit left behind; a run that returned must
   * have freed everything itself, or the tool leaks on that path */
  if (qf_nptrs != 0) {
    fprintf(qf_err, "fuzz_quant_error: the tool left %zu blocks allocated "
                    "after a run that returned\n", qf_nptrs);
    abort();
  }
}

/* The command line: arguments separated by NUL bytes. */
static void run_args(const uint8_t *p, size_t len) {
  char *buf = malloc(len + 1), *argv[34];
  int argc = 1;
  size_t i, start = 0;
  qe_opts_t o;
  if (buf == NULL)
    return;
  memcpy(buf, p, len);
  buf[len] = '\0';
  argv[0] = "zpp-quant-error";
  for (i = 0; i <= len && argc < 33; i++)
    if (buf[i] == '\0') {
      argv[argc++] = buf + start;
      start = i + 1;
    }
  argv[argc] = NULL;
  if (setjmp(qf_jump) == 0) {
    qf_armed = 1;
    qe_parse_args(argc, argv, &o);
  }
  qf_armed = 0;
  qf_release();
  free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  if (qf_null == NULL) {
    qf_err = stderr;
    qf_null = fopen("/dev/null", "w");
    if (qf_null == NULL)
      abort();
    atexit(qf_summary);
  }
  qf_inputs++;
  if (data[0] & 1) {
    run_args(data + 1, size - 1);
    return 0;
  }
  qf_data = data + 1;
  qf_size = size - 1;
  qf_status = 0;
  if (setjmp(qf_jump) == 0) {
    qf_armed = 1;
    run(data[0]);
  }
  qf_armed = 0;
  qf_release();
  if (qf_status == QE_EXIT_LIBRARY) {
    fprintf(qf_err, "fuzz_quant_error: the tool accepted the file but the "
                    "library rejected what it passed (exit status 1)\n");
    abort();
  }
  return 0;
}
