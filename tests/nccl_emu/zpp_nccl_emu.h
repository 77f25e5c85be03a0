/*
 * Test hooks of the NCCL stand-in (tests/nccl_emu), beside NCCL's API.  A
 * test linked with the stand-in declares them from here; a process that
 * loads it with dlopen (libzpp through ZPP_NCCL_LIBRARY) finds them with
 * dlsym on the same library, and skips where they are absent (real NCCL).
 */
#ifndef ZPP_TESTS_NCCL_EMU_ZPP_NCCL_EMU_H
#define ZPP_TESTS_NCCL_EMU_ZPP_NCCL_EMU_H

#ifdef __cplusplus
extern "C" {
#endif

/* The communicators of this process that are neither destroyed nor
 * aborted, and how many of them own their resources (the others are
 * children of ncclCommSplit whose parent has config.splitShare = 1). */
void zpp_nccl_emu_census(int *comms, int *own_resources);
typedef void (*zpp_nccl_emu_census_fn)(int *comms, int *own_resources);

/* hold != 0: calls that return ncclInProgress are not issued (their
 * communicators stay in progress) until the hold ends. */
void zpp_nccl_emu_hold_issue(int hold);

/* The stand-in reads its settings (ZPP_NCCL_EMU_*, and
 * NCCL_COMM_SPLIT_SHARE_RESOURCES) from the environment once, at first
 * use; this sets one from then on (value NULL: unset, the default).
 * Returns 0, or -1 for a name that is not one of its settings or a value
 * longer than 63 characters. */
int zpp_nccl_emu_set(const char *name, const char *value);
typedef int (*zpp_nccl_emu_set_fn)(const char *name, const char *value);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_TESTS_NCCL_EMU_ZPP_NCCL_EMU_H */
