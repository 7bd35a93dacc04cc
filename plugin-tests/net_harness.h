/*
 * net_harness.h: what the parts of net_harness share: the configuration (set by net_harness.c
 * from the command line), the rank context and the shared mailbox (harness_run.c forks the
 * ranks and holds the reporting), the helpers of net_util.c (mailbox, setup, connections,
 * requests, checked transfers) and the scenario functions of net_scn_*.c. Internal to the
 * harness.
 */
#ifndef FABRICOLL_TEST_NET_HARNESS_H
#define FABRICOLL_TEST_NET_HARNESS_H

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "harness_common.h"
#include "harness_run.h"
#include "netapi.h"

/* ------------------------------------------------------------------------------- configuration */

extern const char* g_lib;
extern int g_version;
extern int g_op_timeout_ms;
extern int g_kill_timeout_ms;
extern int g_cycles;
extern double g_time_scale;
extern int g_expect_multi; /* --expect-multi: the maxMultiRequestSize v11+ must report (0: any) */

#define MAXR 4
#define NSLOT 64
#define HSIZE NCCL_NET_HANDLE_MAXSIZE
#define CANARY 0xA5
#define GMAX 64 /* buffers of one grouped receive that group and badinput post at most */

/* ----------------------------------------------------------------------- shared-memory mailbox */

struct slot {
  atomic_uint seq;
  unsigned char data[HSIZE];
};

struct shm {
  hc_board_t b;                /* first: abort, barriers, stage/fail/detail, kill progress (harness_run.h) */
  atomic_llong val[MAXR][8];   /* scenario-defined results */
  struct slot slot[NSLOT];
};
_Static_assert(MAXR <= HC_MAXR, "the runner forks at most HC_MAXR ranks");

typedef struct rctx {
  hc_rank_t hc; /* scenario, rank, ranks, deadline, barrier phase, aborted (harness_run.h) */
  struct shm* shm;
  net_t net;
  net_props_t props;
  int ndev, dev;
  /* optional: describes the state of what a timed-out wait was waiting for */
  void (*diag)(struct rctx* c, char* out, size_t len);
  void* diag_arg;
} rctx_t;

static inline const char* rstr(ncclResult_t r) { return nccl_result_str((int)r); }

/* --------------------------------------------------------- requests and transfers (net_util.c) */

typedef struct {
  void* req;
  int posted;
  int done;
  int is_flush;
  int sizes[NCCL_PROXY_MAX_SUBS];
} op_t;

/* One side of a checked transfer (xfer_step). */
typedef struct {
  void* comm;
  void* mh;
  unsigned char* buf;
  size_t size; /* send: message size; recv: expected message size */
  size_t cap;  /* recv: buffer capacity */
  uint64_t seed;
  int tag;
} side_t;

extern int flush_nulls, flush_reqs; /* iflush statistics for details */

/* ---------------------------------------------------------------------------------- net_util.c */

void publish(rctx_t* c, int slot, unsigned seq, const void* handle);
int fetch(rctx_t* c, int slot, unsigned seq, void* out, const char* what);
int std_setup(rctx_t* c, uint64_t commId);
int std_teardown(rctx_t* c);
int do_listen(rctx_t* c, unsigned char handle[HSIZE], void** lc);
int establish(rctx_t* c, int nconn, unsigned char (*handles)[HSIZE], void** scs, int nacc, void** lcs,
              void** rcs, const char* what);
void op_reset(op_t* op);
int poll_op(rctx_t* c, op_t* op, const char* what);
int wait_ops(rctx_t* c, op_t** ops, int n, const char* what);
int post_isend(rctx_t* c, void* sc, void* data, size_t size, int tag, void* mh, op_t* op, op_t** others,
               int nothers, int* nulls, const char* what);
int post_irecv(rctx_t* c, void* rc, int n, void** data, size_t* sizes, int* tags, void** mhs, op_t* op,
               op_t** others, int nothers, int* nulls, const char* what);
int verify_buf(rctx_t* c, const char* what, const unsigned char* buf, size_t cap, size_t expect, uint64_t seed,
               int got_size);
int check_sizes_tail(rctx_t* c, const char* what, const op_t* op, int n);
int xfer_step(rctx_t* c, const side_t* s, const side_t* r, int flush, const char* what);
int regmr(rctx_t* c, void* comm, void* buf, size_t size, void** mh, const char* what);
int deregmr(rctx_t* c, void* comm, void* mh, const char* what);
int close_send(rctx_t* c, void* sc, const char* what);
int close_recv(rctx_t* c, void* rc, const char* what);
int pair_both_ways(rctx_t* c, void** sc, void** rc, int slot_base, unsigned seq, const char* what);
int pair_one_way(rctx_t* c, void** sc, void** rc, int slot, unsigned seq, const char* what);
int pair_loopback(rctx_t* c, void** sc, void** rc, const char* what);

/* ----------------------------------------------------------------------------- net_scn_setup.c */

int scn_symbols(rctx_t* c);
int scn_connect2(rctx_t* c);
int scn_connect1(rctx_t* c);
int scn_cycles(rctx_t* c);
int scn_versions(rctx_t* c);
int scn_reload(rctx_t* c);

/* ------------------------------------------------------------------------------ net_scn_data.c */

int scn_xfer(rctx_t* c);
/* The size of buffer i of an n-buffer group in a round (multi uses the same sizes). */
size_t group_size(int n, int round, int i);
int scn_group(rctx_t* c);

/* ----------------------------------------------------------------------------- net_scn_multi.c */

int scn_multi(rctx_t* c);
int scn_inflight32(rctx_t* c);

/* ----------------------------------------------------------------------------- net_scn_comms.c */

int scn_pairs16(rctx_t* c);
int scn_crossed(rctx_t* c);
int scn_ring4(rctx_t* c);

/* ----------------------------------------------------------------------------- net_scn_fault.c */

int scn_badinput(rctx_t* c);
int scn_kill_rank(rctx_t* c);

#endif
