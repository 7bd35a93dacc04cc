/*
 * collnet_harness.h: what the parts of collnet_harness share: the configuration (set by
 * collnet_harness.c from the command line), the CollNet table wrapper of collnet_table.c, the
 * data types and reference results of collnet_data.c, the rank context and the shared memory
 * (harness_run.c forks the ranks and holds the reporting), the helpers of collnet_util.c
 * (setup, buffers, operations) and the scenario functions of collnet_scn_*.c and
 * collnet_bench.c. Internal to the harness.
 */
#ifndef FABRICOLL_TEST_COLLNET_HARNESS_H
#define FABRICOLL_TEST_COLLNET_HARNESS_H

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <link.h>
#include <math.h>
#include <sched.h>
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
extern double g_time_scale;
extern int g_kill_victim;     /* set by the parent before forking the kill ranks */
extern int g_print_matrix;    /* support: rank 0 prints the table (first run only) */

#define MAXR 8
#define MAXCASE 1024
#define MAXSIZES 48
#define HSIZE NCCL_NET_HANDLE_MAXSIZE
#define CANARY 0xA5
#define GUARD 64 /* canary bytes before and after every buffer the plugin writes */

/* --bench: sizes -b..-e by factor -f, -n timed and -w warm-up iterations, -c 1: check the results */
extern size_t g_bmin, g_bmax, g_bfactor;
extern int g_biters, g_bwarm, g_bcheck;
/* --chunk C --inflight K: each size is cut into C-byte iallreduce calls with up to K in flight, the
 * way NCCL's proxy hands CollNet one chunk per call (0 = the whole size in one call). */
#define MAXINFLIGHT 64
extern size_t g_bchunk;
extern int g_binflight;
extern int g_bench_nsizes; /* the sizes the ranks time (set by the parent before forking) */
extern size_t g_bench_sizes[MAXSIZES];

/* ------------------------------------------------------------ CollNet tables (collnet_table.c) */

typedef struct {
  void* mhandle;
  void* address;
  size_t size;
} cn_sge_t;

typedef struct {
  int version;
  const void* table;
  const ncclCollNet_v6_t* t6;
  const ncclCollNet_v7_t* t7;
  const ncclCollNet_v8_t* t8;
  const ncclCollNet_v9_t* t9;
  const ncclCollNet_v10_t* t10;
  const ncclCollNet_v11_t* t11;
  const ncclCollNet_v12_t* t12;
  void* ctx; /* v11+ */
} cn_t;

extern atomic_long cn_logger_bad_calls; /* logger calls with a bad level or a NULL format */

const char* cn_symbol_name(int v);
size_t cn_table_size(int v);
int cn_bind(cn_t* n, void* dl, int v, char* err, size_t errlen);
ncclResult_t cn_init(cn_t* n, uint64_t commId);
ncclResult_t cn_finalize(cn_t* n);
ncclResult_t cn_devices(cn_t* n, int* ndev);
ncclResult_t cn_get_props_raw(cn_t* n, int dev, void* buf);
ncclResult_t cn_listen(cn_t* n, int dev, void* handle, void** lc);
ncclResult_t cn_connect(cn_t* n, void** handles, int nranks, int rank, void* lc, void** cc);
ncclResult_t cn_reduce_support(cn_t* n, int dt, int op, int* supported);
ncclResult_t cn_regmr(cn_t* n, void* cc, void* data, size_t size, int type, void** mh);
ncclResult_t cn_regmr_dmabuf(cn_t* n, void* cc, void* data, size_t size, int type, uint64_t off, int fd,
                             void** mh);
ncclResult_t cn_deregmr(cn_t* n, void* cc, void* mh);
ncclResult_t cn_iallreduce(cn_t* n, void* cc, void* s, void* r, size_t count, int dt, int op, void* smh,
                           void* rmh, void** req);
ncclResult_t cn_iallgather(cn_t* n, void* cc, void* send, int np, const cn_sge_t* parts, size_t bpr,
                           size_t off, size_t wb, void* smh, void** req);
ncclResult_t cn_ireducescatter(cn_t* n, void* cc, int np, const cn_sge_t* parts, void* recv, size_t bpr,
                               size_t off, size_t wb, int dt, int op, void* rmh, void** req);
ncclResult_t cn_iflush(cn_t* n, void* cc, void* data, int size, void* mh, void** req);
ncclResult_t cn_test(cn_t* n, void* req, int* done, int* size);
ncclResult_t cn_close_coll(cn_t* n, void* cc);
ncclResult_t cn_close_listen(cn_t* n, void* lc);
int cn_null_members(const cn_t* n, char* out, size_t len, char* optional, size_t olen);

/* ------------------------------------------------ data types, inputs, results (collnet_data.c) */

extern const int g_eltsize[12]; /* bytes of each NCCL data type */
/* How a case's inputs are made and its result checked (see gen_elem in collnet_data.c). */
enum { MODE_EXACT = 0, MODE_TOL = 1 };

const char* tname(int t);
const char* oname(int o);
int is_float(int t);
double load_f(int t, const void* buf, size_t i, int* special);
uint64_t load_bits(int t, const void* buf, size_t i);
void store_bits(int t, void* buf, size_t i, uint64_t v);
void store_f(int t, void* buf, size_t i, double v);
uint64_t hash_bytes(const void* buf, size_t len);
void gen_buf(int t, int op, int mode, uint64_t seed, size_t count, void* buf);
uint64_t int_combine(int t, int op, uint64_t a, uint64_t b);
double f_combine(int op, double a, double b);
size_t check_reduction(int t, int op, int mode, int nranks, const uint64_t* seeds, size_t count,
                       const void* res, unsigned char* ins, char* msg, size_t mlen);

/* --------------------------------------------------------------------- ranks and shared memory */

struct shm {
  hc_board_t b; /* first: abort, barriers, stage/fail/detail, kill progress (harness_run.h) */
  atomic_llong closed_ns[MAXR];
  atomic_int kerr[MAXR];      /* kill: the survivor's error code */
  atomic_llong kms_x10[MAXR]; /* kill: its delay after the SIGKILL, in 0.1 ms */
  atomic_llong kdone[MAXR];   /* kill: collectives completed before the kill */
  atomic_uint hseq[MAXR];
  unsigned char handle[MAXR][HSIZE];
  atomic_int ncase[MAXR];
  uint64_t hash[MAXR][MAXCASE];
  double bench_us[MAXR][MAXSIZES];
  int bench_bad[MAXR][MAXSIZES];
};
_Static_assert(MAXR <= HC_MAXR, "the runner forks at most HC_MAXR ranks");

typedef struct rctx {
  hc_rank_t hc; /* scenario, rank, ranks, deadline, barrier phase, aborted (harness_run.h) */
  struct shm* shm;
  void* dl;
  cn_t cn;
  net_props_t props;
  int ndev;
  void* cc;
  unsigned gen; /* handle-exchange generation */
} rctx_t;

static inline const char* rstr(ncclResult_t r) { return nccl_result_str((int)r); }

/* -------------------------------------------------------------------- helpers (collnet_util.c) */

/* page-aligned, zeroed, with GUARD canary bytes before and after [p, p+size) */
typedef struct {
  unsigned char* base;
  unsigned char* p;
  size_t size, alloc;
} gbuf_t;

/* One collective operation: what cop_post posts and cop_poll/cop_wait follow. */
enum { K_AR = 0, K_AG = 1, K_RS = 2 };

typedef struct {
  int kind;
  void* send;
  void* recv;
  size_t count; /* allreduce */
  int dt, op;
  void* smh;
  void* rmh;
  cn_sge_t part; /* allgather: recvParts[0]; reducescatter: sendParts[0] */
  size_t bpr, off, wb;
  cn_t* cn; /* NULL: the rank's table and collComm (c->cn, c->cc) */
  void* cc;
  /* state */
  void* req;
  int posted, done, size, nulls;
  char what[160];
} cop_t;

int gbuf_alloc(rctx_t* c, gbuf_t* b, size_t size, const char* what);
void gbuf_free(gbuf_t* b);
void gbuf_arm(gbuf_t* b, size_t off, size_t len, int fill);
long gbuf_guard_bad(const gbuf_t* b, size_t off, size_t len);
int open_lib(rctx_t* c);
int cn_connect_all(rctx_t* c, int dev, void** ccout, double* connect_ms);
int cn_init_checked(rctx_t* c, int v, uint64_t commId);
uint64_t comm_id(rctx_t* c);
int std_setup(rctx_t* c);
int std_teardown(rctx_t* c);
int regmr(rctx_t* c, void* data, size_t size, void** mh, const char* what);
int deregmr(rctx_t* c, void* mh, const char* what);
int cop_post(rctx_t* c, cop_t* o, cop_t** others, int nothers);
int cop_wait(rctx_t* c, cop_t** ops, int n);
int cop_run(rctx_t* c, cop_t* o);

/* ------------------------------------------------------------------------- collnet_scn_setup.c */

int scn_symbols(rctx_t* c);
int scn_support(rctx_t* c);
int scn_versions(rctx_t* c);

/* -------------------------------------------------------------------------- collnet_scn_coll.c */

int scn_allreduce(rctx_t* c);
int scn_allgather(rctx_t* c);
int scn_reducescatter(rctx_t* c);

/* ------------------------------------------------------------------------ collnet_scn_stress.c */

int scn_inflight(rctx_t* c);
int scn_twocomms(rctx_t* c);
int scn_kill(rctx_t* c);

/* ----------------------------------------------------------------------------- collnet_bench.c */

int scn_bench(rctx_t* c);

#endif
