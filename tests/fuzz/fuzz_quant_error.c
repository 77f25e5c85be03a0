/*
 * libFuzzer target: the file readers of tools/zpp_quant_error.c (raw
 * tensors, .npy, .safetensors with its JSON header) and its command line,
 * on arbitrary bytes.
 *
 * The tool is compiled in here as it is: its main is renamed, and the
 * macros below give it a way out that returns to the fuzzer instead of
 * ending the process.  exit() (the tool's only way out, in qe_fail) jumps
 * back here; the memory and FILEs the tool had open then are released by
 * this file, which tracks malloc/realloc/free and fopen/fclose of the
 * tool's code.  The file the tool opens is the fuzz input itself
 * (fmemopen): nothing touches the file system.
 *
 * Input: byte 0 selects the reader (% 4: raw, .npy, .safetensors, command
 * line) and, for raw files, the --input-dtype ((byte 0 / 4) % 3); the rest
 * is the file (or the arguments, separated by NUL bytes).
 *
 * What must hold: no sanitizer report, and an input the tool accepts
 * measures without a library error (exit status 1 would mean the reader
 * passed the library something it rejects).
 */
/* Every header the tool includes, before the macros below rename
 * anything in them. */
#include <zpp/zpp.h>

#include "quant_math.h"

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

static void run(int kind, int dtype) {
  static const char *const dtypes[] = {"fp32", "fp16", "bf16"};
  static const char *const paths[] = {"fuzz.bin", "fuzz.npy",
                                      "fuzz.safetensors"};
  /* one cheap configuration: the readers are what is fuzzed */
  char *argv[] = {"zpp-quant-error", "--input", (char *)paths[kind],
                  "--bits", "4", "--block", "64", "--sym", NULL, NULL, NULL};
  qe_opts_t o;
  qe_rows_t rows = {NULL, 0, 0};
  qe_tensor_t t;
  int argc = 8, nents = 0, k;
  qe_st_entry_t *ents = NULL;
  if (kind == 0) {
    argv[argc++] = "--input-dtype";
    argv[argc++] = (char *)dtypes[dtype];
  }
  qe_parse_args(argc, argv, &o);
  if (kind == 2) {
    ents = qe_run_safetensors(&o, qf_null, &rows, &nents);
  } else {
    memset(&t, 0, sizeof t);
    if (kind == 1)
      qe_read_npy(&o, &t);
    else
      qe_read_raw(&o, &t);
    qe_measure_all(&o, &t, &rows);
    qe_tensor_free(&t);
  }
  qe_print(&o, &rows, qf_null); /* rows point at the names */
  qf_free(rows.rows);
  if (kind != 2)
    qf_free(t.name_buf);
  for (k = 0; k < nents; k++) {
    qf_free(ents[k].name);
    qf_free(ents[k].dtype);
  }
  qf_free(ents);
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
  int kind;
  if (size == 0)
    return 0;
  if (qf_null == NULL) {
    qf_err = stderr;
    qf_null = fopen("/dev/null", "w");
    if (qf_null == NULL)
      abort();
  }
  kind = data[0] % 4;
  if (kind == 3) {
    run_args(data + 1, size - 1);
    return 0;
  }
  qf_data = data + 1;
  qf_size = size - 1;
  qf_status = 0;
  if (setjmp(qf_jump) == 0) {
    qf_armed = 1;
    run(kind, (data[0] / 4) % 3);
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
