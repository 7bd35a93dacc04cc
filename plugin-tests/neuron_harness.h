/*
 * neuron_harness.h: what the parts of neuron_harness share: the rank context and the shared
 * mailbox (harness_run.c forks the ranks for neuron_harness.c and holds the reporting), the
 * helpers of neuron_util.c (logger, checked return codes, mailbox), those of neuron_calls.c (a
 * version-independent caller of the v4/v5/v6 tables, connection and transfer helpers) and the
 * scenario functions (neuron_scn_*.c). Internal to the harness.
 */
#ifndef FABRICOLL_TEST_NEURON_HARNESS_H
#define FABRICOLL_TEST_NEURON_HARNESS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "harness_common.h" /* errs_t, patterns, fd/RSS counts, STAGE_LEN, FAIL_LEN, MIB, ... */
#include "harness_run.h"    /* the board, hc_rank_t, stagef/failf/detailf/sync_ranks, the runner */
#include "neuron_net.h"

#define MAXR 4
#define NSLOT 16
#define HSIZE NCCL_NET_HANDLE_MAXSIZE

/* ------------------------------------------------------------------------------ configuration */

extern const char* g_lib;
extern int g_op_timeout_ms;   /* one operation (a connection, a transfer, a barrier) */
extern int g_kill_timeout_ms; /* FABRICOLL_TIMEOUT_MS of the kill and badinput ranks */
extern int g_cycles;
extern int g_expect_rma;  /* --expect-rma: the rma_supported props must report; -1: not checked */

/* --------------------------------------------------------------------- shared-memory mailbox */

struct slot {
  atomic_uint seq;
  unsigned char data[HSIZE];
};

struct shm {
  hc_board_t b; /* first: abort, barriers, checks, stage/fail/detail, kill progress (harness_run.h) */
  struct slot slot[MAXR][NSLOT]; /* slot[writer][k] */
};
_Static_assert(MAXR <= HC_MAXR, "the runner forks at most HC_MAXR ranks");

/* The table a rank plays libnccom with; only the member of its version is set. */
typedef struct {
  int v; /* 4, 5 or 6 */
  void* dl;
  const ncclNet_v4_t* t4;
  const ncclNet_v5_t* t5;
  const ncclNet_v6_t* t6;
} nn_t;

typedef struct rctx {
  hc_rank_t hc; /* scenario, rank, ranks, deadline, barrier phase, aborted, checks (harness_run.h) */
  struct shm* shm;
  nn_t n;
  ncclNetProperties_v6_t props; /* of device 0; v4 fields copied, the others 0 */
  int ndev;
} rctx_t;

/* -------------------------------------------------------------------------------- logger */

void nn_logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
extern atomic_long log_calls, log_warns, log_no_net, log_bad;
extern char log_last_warn[512];

/* ------------------------------------------------------------------------------ small helpers */

/* Defined in netapi.c, linked as it is (its header declares NVIDIA's layouts, so it is not
 * included here): the names of ncclResult_t values (the same numbers in both ABIs). Its clock,
 * HARNESS_VERBOSE logging and back-off are declared in harness_common.h. */
const char* nccl_result_str(int r); /* netapi.c: also names 1000, NN_NO_MEMBER, "table member is NULL" */
static inline const char* rstr(int r) { return nccl_result_str(r); }

/* One check of a returned code: counted; a mismatch goes into e. An error code returned once the
 * library has a logger must come with a WARN line (contract: errors are logged at WARN); w0 is
 * the WARN count before the call. Use EXPECT_RC, which takes that count. */
void expect_rc(rctx_t* c, errs_t* e, const char* what, ncclResult_t got, ncclResult_t want, long w0);
#define EXPECT_RC(c, e, what, call, want)             \
  do {                                                \
    long w0_ = atomic_load(&log_warns);               \
    ncclResult_t r_ = (call);                         \
    expect_rc((c), (e), (what), r_, (want), w0_);     \
  } while (0)
extern int g_logger_given; /* init was called: the library has our logger */
/* Turns the accumulated problems into the rank's failure (0 when there were none). */
int errs_finish(rctx_t* c, errs_t* e, const char* scope);


/* ------------------------------------------------------------------------ mailbox (no plugin) */

void publish(rctx_t* c, int slot, unsigned seq, const void* data);
int fetch(rctx_t* c, int from, int slot, unsigned seq, void* out, const char* what);

/* ------------------------------------------------------- calling the tables (neuron_util.c) */

int nn_open(nn_t* n, const char* path, int version, char* err, size_t errlen);
void nn_close_dl(nn_t* n);
ncclResult_t nn_init(nn_t* n);
ncclResult_t nn_fini(nn_t* n); /* v6 only */
ncclResult_t nn_devices(nn_t* n, int* ndev);
ncclResult_t nn_props(nn_t* n, int dev, ncclNetProperties_v6_t* out);
ncclResult_t nn_listen(nn_t* n, int dev, void* handle, void** lc);
ncclResult_t nn_connect(nn_t* n, int dev, void* handle, void** sc);
ncclResult_t nn_accept(nn_t* n, void* lc, void** rc);
ncclResult_t nn_regmr(nn_t* n, void* comm, void* data, size_t size, int type, void** mh);
ncclResult_t nn_deregmr(nn_t* n, void* comm, void* mh);
ncclResult_t nn_isend(nn_t* n, void* sc, void* data, int size, int tag, void* mh, void** req);
ncclResult_t nn_irecv1(nn_t* n, void* rc, void* data, int size, int tag, void* mh, void** req);
ncclResult_t nn_test(nn_t* n, void* req, int* done, int* sizes);
ncclResult_t nn_close_send(nn_t* n, void* sc);
ncclResult_t nn_close_recv(nn_t* n, void* rc);
ncclResult_t nn_close_listen(nn_t* n, void* lc);
/* The v5/v6 members; on a v4 table they return NN_NO_MEMBER. */
#define NN_NO_MEMBER ((ncclResult_t)1000)
ncclResult_t nn_irecv(nn_t* n, void* rc, int nr, void** data, int* sizes, int* tags, void** mhs, void** req);
ncclResult_t nn_iflush(nn_t* n, void* rc, int nr, void** data, int* sizes, void** mhs, void** req);
ncclResult_t nn_regmr_dmabuf(nn_t* n, void* comm, void* data, size_t size, int type, uint64_t off, int fd,
                             void** mh);
ncclResult_t nn_getmrkey(nn_t* n, void* mh, uint64_t* key);
ncclResult_t nn_iwrite(nn_t* n, void* sc, void* src, size_t size, void* mh, uint64_t dest, uint64_t key, void** req);
ncclResult_t nn_iwrite_inline(nn_t* n, void* sc, void* src, size_t size, uint64_t dest, uint64_t key, void** req);
ncclResult_t nn_iread(nn_t* n, void* rc, void* dest, size_t size, void* mh, uint64_t src, uint64_t key, void** req);

/* ------------------------------------------------ setup, connections, transfers (neuron_util.c) */

/* dlopen + bind version v, init, devices, getProperties(0). */
int std_setup(rctx_t* c, int version);
/* v6: fini; others: nothing (they have no fini). Then dlclose. */
int std_teardown(rctx_t* c);
/* Rank `lis` listens and publishes its handle in slot `slot` (seq); rank `con` connects to it.
 * The other ranks do nothing. v5/v6 poll; v4 blocks. */
int pair_one_way(rctx_t* c, int con, int lis, void** sc, void** rc, int slot, unsigned seq, const char* what);
/* In one thread of one process: listen, then connect and accept alternately (v5/v6). */
int pair_loopback(rctx_t* c, void** sc, void** rc, const char* what);

/* Post (retrying while the request comes back NULL) and wait (test until done) with deadlines. */
int post_send(rctx_t* c, void* sc, void* data, int size, int tag, void* mh, void** req, const char* what);
int post_recv(rctx_t* c, void* rc, void* data, int size, int tag, void* mh, void** req, const char* what);
int wait_req(rctx_t* c, void* req, int* size_out, const char* what);
/* Both sides of a transfer in one call: send and/or receive (NULL comm: that side is not here),
 * then check the received bytes, the reported size and the canary after the message. */
int xfer(rctx_t* c, void* sc, void* smh, unsigned char* sbuf, void* rc, void* rmh, unsigned char* rbuf, size_t rcap,
         size_t size, uint64_t seed, const char* what);
int regmr(rctx_t* c, void* comm, void* buf, size_t size, void** mh, const char* what);
int deregmr(rctx_t* c, void* comm, void* mh, const char* what);

/* -------------------------------------------------------------------------------- scenarios */

int scn_symbols(rctx_t* c);
int scn_props(rctx_t* c);
int scn_lifecycle(rctx_t* c);
int scn_connect1(rctx_t* c);
int scn_mesh4(rctx_t* c);
int scn_connect4(rctx_t* c);
int scn_xfer6(rctx_t* c);
int scn_xfer5(rctx_t* c);
int scn_xfer4(rctx_t* c);
int scn_inflight(rctx_t* c);
int scn_bigreg(rctx_t* c);
int scn_rma6(rctx_t* c);
int scn_rma5(rctx_t* c);
int scn_ring6(rctx_t* c);
int scn_ring5(rctx_t* c);
int scn_ringcycles(rctx_t* c);
int scn_badinput(rctx_t* c);
int scn_v4block(rctx_t* c);
int scn_cycles(rctx_t* c);
int scn_kill(rctx_t* c);

#endif
