/*
 * harness_run.h: the process model the C harnesses (net_harness, collnet_harness,
 * neuron_harness) share. The parent never loads the plugin: for each scenario it maps an
 * anonymous MAP_SHARED region and forks the ranks, waits with the scenario's deadline (calling a
 * hook while it waits), kills and reports what is left (with gdb stacks of a hung rank) and turns
 * the ranks' exit codes and messages into one reason. The ranks report through the hc_board_t at
 * the start of that region: what they are doing (stagef), their first failure (failf), a detail
 * line (detailf), barriers (sync_ranks) and the abort flag every wait polls (check_abort).
 *
 * A harness's shared region is its own struct whose FIRST member is an hc_board_t, and its rank
 * context is its own struct whose member `hc` is an hc_rank_t; the reporting macros below take
 * such a context.
 */
#ifndef FABRICOLL_TEST_HARNESS_RUN_H
#define FABRICOLL_TEST_HARNESS_RUN_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "harness_common.h"

#define HC_MAXR 8 /* the most ranks a harness forks for one scenario */

/* What the runner and the reporting helpers use of the shared region. */
typedef struct {
  atomic_int abort;             /* some rank failed or the parent gave up: everybody stop */
  atomic_int phase[HC_MAXR];    /* barrier counters */
  atomic_llong checks[HC_MAXR]; /* checks each rank made (summed by the runner) */
  atomic_llong progress[HC_MAXR]; /* kill: what each rank completed, for the parent's hook */
  atomic_llong kill_ns;           /* kill: CLOCK_MONOTONIC time of the parent's SIGKILL */
  int kill_victim;                /* kill: the rank the parent SIGKILLs (hc_runspec_t.kill_victim) */
  char stage[HC_MAXR][STAGE_LEN]; /* what each rank is doing, for timeout reports */
  char fail[HC_MAXR][FAIL_LEN];   /* the first failure message of each rank */
  char detail[HC_MAXR][DETAIL_LEN];
} hc_board_t;

/* What the reporting helpers know of a rank. */
typedef struct {
  const char* scn;
  int rank, nranks;
  hc_board_t* board;
  int64_t deadline;  /* the rank must finish (or report) before this */
  int op_timeout_ms; /* the deadline of one operation (a connection, a transfer, a barrier) */
  int phase;         /* barriers passed */
  int aborted;       /* gave up because another rank failed */
  long long checks;  /* checks made, for the PASS line */
} hc_rank_t;

void hc_stagef(hc_rank_t* h, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
/* Records the rank's first failure, sets the abort flag, prints to stderr; returns -1. */
int hc_failf(hc_rank_t* h, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void hc_detailf(hc_rank_t* h, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
/* 1 (and h->aborted set) when another rank or the parent gave up. */
int hc_check_abort(hc_rank_t* h);
/* now + op_timeout_ms, but no later than the rank's deadline. */
int64_t hc_op_deadline(hc_rank_t* h);
/* A barrier with a deadline that never calls into the plugin (like NCCL, a rank with nothing
 * posted does not drive it) and never blocks on a dead process (the parent sets abort). */
int hc_sync_ranks(hc_rank_t* h, const char* what);
/* A zeroed, page-aligned buffer of at least `size` bytes (one page for 0); NULL after failf. */
void* hc_xalloc(hc_rank_t* h, size_t size, const char* what);

/* fd and RSS readings of a cycles scenario (open/use/close N times): fds and RSS after cycle
 * `mark`, RSS after cycle `mid`, both after the last cycle (`last`). A leak grows RSS in both
 * halves; a pool that the provider maps at start and touches all at once later grows it in one. */
typedef struct {
  int mark, mid, last;
  int fd_mark, fd_end;
  long rss_mark, rss_mid, rss_end;
} hc_growth_t;
/* Readings not taken yet are -1. */
void hc_growth_init(hc_growth_t* g, int mark, int mid, int last);
/* Takes the readings due once `done` cycles are complete (call after each cycle). */
void hc_growth_sample(hc_growth_t* g, int done);
/* The readings as the rank's detail line; fails when the open fds grew, when RSS grew by more
 * than 4 MiB in both halves or by more than 32 MiB in all. */
int hc_check_growth(hc_rank_t* h, const hc_growth_t* g);

/* The harnesses call these on their rank context c (any struct with an hc_rank_t member hc). */
#define stagef(c, ...) hc_stagef(&(c)->hc, __VA_ARGS__)
#define failf(c, ...) hc_failf(&(c)->hc, __VA_ARGS__)
#define detailf(c, ...) hc_detailf(&(c)->hc, __VA_ARGS__)
#define check_abort(c) hc_check_abort(&(c)->hc)
#define op_deadline(c) hc_op_deadline(&(c)->hc)
#define sync_ranks(c, what) hc_sync_ranks(&(c)->hc, (what))
#define xalloc(c, size, what) hc_xalloc(&(c)->hc, (size), (what))
#define check_growth(c, g) hc_check_growth(&(c)->hc, (g))

/* ------------------------------------------------------------------------------ the runner */

typedef struct hc_runstate hc_runstate_t;

typedef struct {
  const char* name;
  int nranks;
  int timeout_s;        /* the scenario's deadline */
  int op_timeout_ms;    /* hc_rank_t.op_timeout_ms of the ranks */
  int short_timeout_ms; /* > 0: FABRICOLL_TIMEOUT_MS of the ranks */
  size_t shm_size;      /* of the harness's shared struct (an hc_board_t first) */
  /* In the forked rank: run the scenario with a context built around *h (filled in, with the
   * board at the start of shm); copy the context's hc back into *h; 0 = success. */
  int (*rank_main)(const void* arg, hc_rank_t* h, void* shm);
  const void* arg;                /* for rank_main and the hook */
  int (*hook)(hc_runstate_t* rs); /* called by the parent while waiting; -1 = fail (rs->reason) */
  int kill_victim;                /* board.kill_victim of the ranks */
} hc_runspec_t;

struct hc_runstate {
  const hc_runspec_t* spec;
  void* shm; /* the harness's shared struct */
  pid_t pid[HC_MAXR];
  int exited[HC_MAXR];
  int status[HC_MAXR];
  int expect_killed[HC_MAXR]; /* the hook SIGKILLed it: that death is no failure */
  int64_t start;
  char reason[FAIL_LEN];
};

/* Runs the scenario's ranks once; 0 = all passed. Appends to reason and details (ranks' detail
 * lines, duplicates once), adds the ranks' checks to *checks (may be NULL). With shm_out the
 * shared region is handed back (munmap it with spec->shm_size), else unmapped. */
int hc_run_ranks(const hc_runspec_t* spec, char* reason, size_t rlen, char* details, size_t dlen, long long* checks,
                 void** shm_out);

/* The hook of a two-rank kill scenario (a stream from rank 0 to rank 1): SIGKILLs
 * spec->kill_victim once both ranks count 3 in board.progress, recording the time in
 * board.kill_ns; then fails when the survivor has not finished 10 s after it should have
 * reported (short_timeout_ms + 5 s), with its stacks, or when the stream never got going. */
int hc_kill_pair_hook(hc_runstate_t* rs);
/* Runs a two-rank kill scenario twice, the receiver (rank 1) killed, then the sender (rank 0). */
int hc_run_kill_pair(const hc_runspec_t* spec, char* reason, size_t rlen, char* details, size_t dlen,
                     long long* checks);

#endif
