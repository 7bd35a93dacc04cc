/*
 * net_harness: multi-process conformance tests for an NCCL net plugin (ncclNetPlugin_v6..v12),
 * written for fabricoll.
 *
 *   net_harness --lib PATH [--scenario NAME[,NAME...]|all] [--skip NAME[,...]] [--version 12]
 *               [--op-timeout-ms 30000] [--kill-timeout-ms 3000] [--cycles 1000] [--time-scale 1.0]
 *               [--expect-multi N] [--list]
 *
 * Process model: the parent never dlopens the plugin. For every scenario it makes an anonymous
 * MAP_SHARED mapping, then forks the scenario's rank processes; each rank dlopens the plugin
 * itself (there is no fork after dlopen anywhere). Ranks exchange 128-byte handles and flags
 * through the mapping by polling with deadlines; nothing blocks on a dead process. The parent
 * waits with a global deadline, kills what is left, and prints
 *   PASS name (details)        or        FAIL name: reason
 * then "net_harness: N passed, M failed", exiting non-zero on any failure.
 *
 * Environment: FABRICOLL_* variables are passed through to the plugin unchanged, except that the
 * kill and badinput ranks get FABRICOLL_TIMEOUT_MS=<--kill-timeout-ms> (default 3000) so that a
 * dead peer or an unusable handle is reported within a bounded time. HARNESS_VERBOSE=1 prints
 * progress and the plugin's log messages.
 */
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

/* ------------------------------------------------------------------------------ configuration */

static const char* g_lib;
static int g_version = 12;
static int g_op_timeout_ms = 30000;
static int g_kill_timeout_ms = 3000;
static int g_cycles = 1000;
static double g_time_scale = 1.0;
static int g_expect_multi = 0; /* --expect-multi: the maxMultiRequestSize v11+ must report (0: any) */

#define MAXR 4
#define NSLOT 64
#define HSIZE NCCL_NET_HANDLE_MAXSIZE
#define CANARY 0xA5

/* --------------------------------------------------------------------- shared-memory mailbox */

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

static const char* rstr(ncclResult_t r) { return nccl_result_str((int)r); }

/* ------------------------------------------------------------------- handles, flags, barriers */

static void publish(rctx_t* c, int slot, unsigned seq, const void* handle) {
  memcpy(c->shm->slot[slot].data, handle, HSIZE);
  atomic_store_explicit(&c->shm->slot[slot].seq, seq, memory_order_release);
}

static int fetch(rctx_t* c, int slot, unsigned seq, void* out, const char* what) {
  int64_t deadline = op_deadline(c);
  int spins = 0;
  stagef(c, "waiting for %s (mailbox slot %d, seq %u)", what, slot, seq);
  while (atomic_load_explicit(&c->shm->slot[slot].seq, memory_order_acquire) != seq) {
    if (check_abort(c)) return -1;
    if (now_ns() > deadline) return failf(c, "timed out waiting for %s (mailbox slot %d, seq %u)", what, slot, seq);
    backoff(&spins);
  }
  memcpy(out, c->shm->slot[slot].data, HSIZE);
  return 0;
}

/* --------------------------------------------------------------------------- plugin plumbing */

static int std_setup(rctx_t* c, uint64_t commId) {
  char err[512];
  stagef(c, "dlopen %s (ncclNetPlugin_v%d)", g_lib, g_version);
  if (net_open(&c->net, g_lib, g_version, err, sizeof err) != 0) return failf(c, "%s", err);
  stagef(c, "init v%d", g_version);
  ncclResult_t r = net_init(&c->net, commId);
  if (r != ncclSuccess) return failf(c, "v%d init returned %d (%s)", g_version, r, rstr(r));
  r = net_devices(&c->net, &c->ndev);
  if (r != ncclSuccess) return failf(c, "devices returned %d (%s)", r, rstr(r));
  if (c->ndev < 1) return failf(c, "devices reported %d devices", c->ndev);
  c->dev = 0;
  r = net_get_props(&c->net, c->dev, &c->props);
  if (r != ncclSuccess) return failf(c, "getProperties(0) returned %d (%s)", r, rstr(r));
  if (c->props.maxRecvs < 1) return failf(c, "getProperties(0): maxRecvs %d", c->props.maxRecvs);
  return 0;
}

static int std_teardown(rctx_t* c) {
  stagef(c, "finalize");
  ncclResult_t r = net_finalize(&c->net);
  if (r != ncclSuccess) return failf(c, "finalize returned %d (%s)", r, rstr(r));
  return 0;
}

static int do_listen(rctx_t* c, unsigned char handle[HSIZE], void** lc) {
  unsigned char buf[HSIZE + 64];
  memset(buf, 0xEE, sizeof buf);
  void* l = NULL;
  stagef(c, "listen(dev %d)", c->dev);
  ncclResult_t r = net_listen(&c->net, c->dev, buf, &l);
  if (r != ncclSuccess) return failf(c, "listen(dev %d) returned %d (%s)", c->dev, r, rstr(r));
  if (l == NULL) return failf(c, "listen returned ncclSuccess with a NULL listenComm");
  for (int i = HSIZE; i < (int)sizeof buf; i++)
    if (buf[i] != 0xEE) return failf(c, "listen wrote past the 128-byte handle (byte %d changed)", i);
  memcpy(handle, buf, HSIZE);
  *lc = l;
  return 0;
}

/* Polls connect (for each handle) and accept (for each listenComm) in one loop until every comm
 * exists, as NCCL's proxy does. Closes each listenComm right after its accept succeeds. */
static int establish(rctx_t* c, int nconn, unsigned char (*handles)[HSIZE], void** scs, int nacc, void** lcs,
                     void** rcs, const char* what) {
  int64_t deadline = op_deadline(c), t0 = now_ns();
  int64_t max_call = 0;
  const char* max_call_what = "";
  int spins = 0;
  for (int i = 0; i < nconn; i++) scs[i] = NULL;
  for (int i = 0; i < nacc; i++) rcs[i] = NULL;
  stagef(c, "%s: polling %d connect + %d accept", what, nconn, nacc);
  for (;;) {
    int pending = 0, progressed = 0;
    for (int i = 0; i < nconn; i++) {
      if (scs[i]) continue;
      int64_t t = now_ns();
      ncclResult_t r = net_connect(&c->net, c->dev, handles[i], &scs[i]);
      t = now_ns() - t;
      if (t > max_call) max_call = t, max_call_what = "connect";
      if (r != ncclSuccess) return failf(c, "%s: connect #%d returned %d (%s)", what, i, r, rstr(r));
      if (scs[i]) progressed = 1;
      else pending++;
    }
    for (int i = 0; i < nacc; i++) {
      if (rcs[i]) continue;
      int64_t t = now_ns();
      ncclResult_t r = net_accept(&c->net, lcs[i], &rcs[i]);
      t = now_ns() - t;
      if (t > max_call) max_call = t, max_call_what = "accept";
      if (r != ncclSuccess) return failf(c, "%s: accept #%d returned %d (%s)", what, i, r, rstr(r));
      if (rcs[i]) {
        progressed = 1;
        r = net_close_listen(&c->net, lcs[i]);
        if (r != ncclSuccess) return failf(c, "%s: closeListen #%d after accept returned %d (%s)", what, i, r, rstr(r));
        lcs[i] = NULL;
      } else {
        pending++;
      }
    }
    if (c->net.devcomm_written)
      return failf(c, "%s: the plugin stored a non-NULL device handle in *devComm (a HOST plugin must leave it NULL)",
                   what);
    if (!pending) break;
    if (progressed) spins = 0;
    if (check_abort(c)) return -1;
    if (now_ns() > deadline) {
      int nc = 0, na = 0;
      for (int i = 0; i < nconn; i++) nc += scs[i] != NULL;
      for (int i = 0; i < nacc; i++) na += rcs[i] != NULL;
      return failf(c, "%s: connection setup timed out after %.0f ms: %d/%d connects and %d/%d accepts done", what,
                   ms_since(t0), nc, nconn, na, nacc);
    }
    backoff(&spins);
  }
  if (max_call > 1000000000LL)
    return failf(c, "%s: one %s call blocked for %.0f ms (connection setup must not block)", what, max_call_what,
                 (double)max_call / 1e6);
  return 0;
}

typedef struct {
  void* req;
  int posted;
  int done;
  int is_flush;
  int sizes[NCCL_PROXY_MAX_SUBS];
} op_t;

static void op_reset(op_t* op) {
  memset(op, 0, sizeof *op);
  memset(op->sizes, 0xFF, sizeof op->sizes); /* -1: "not written" */
}

/* Test one op if it is posted and not yet done. */
static int poll_op(rctx_t* c, op_t* op, const char* what) {
  if (!op->posted || op->done) return 0;
  int done = 0;
  ncclResult_t r = net_test(&c->net, op->req, &done, op->is_flush ? NULL : op->sizes);
  if (r != ncclSuccess) return failf(c, "%s: test() returned %d (%s)", what, r, rstr(r));
  if (done) op->done = 1;
  return 0;
}

static int wait_ops(rctx_t* c, op_t** ops, int n, const char* what) {
  int64_t deadline = op_deadline(c), t0 = now_ns();
  int spins = 0;
  stagef(c, "%s: waiting for %d requests", what, n);
  for (;;) {
    int left = 0;
    for (int i = 0; i < n; i++) {
      int was = ops[i]->done;
      if (poll_op(c, ops[i], what)) return -1;
      if (!ops[i]->done) left++;
      if (ops[i]->done && !was) spins = 0;
    }
    if (!left) return 0;
    if (check_abort(c)) return -1;
    if (now_ns() > deadline) {
      char d[768] = "";
      if (c->diag) c->diag(c, d, sizeof d);
      return failf(c, "%s: %d of %d requests not done after %.0f ms of test() polling%s%s", what, left, n, ms_since(t0),
                   d[0] ? "; " : "", d);
    }
    backoff(&spins);
  }
}

/* isend, retrying a NULL request while testing the other outstanding ops. */
static int post_isend(rctx_t* c, void* sc, void* data, size_t size, int tag, void* mh, op_t* op, op_t** others,
                      int nothers, int* nulls, const char* what) {
  op_reset(op);
  int64_t deadline = op_deadline(c), t0 = now_ns();
  int spins = 0;
  for (;;) {
    void* req = NULL;
    ncclResult_t r = net_isend(&c->net, sc, data, size, tag, mh, &req);
    if (r != ncclSuccess) return failf(c, "%s: isend(size %zu, tag %d) returned %d (%s)", what, size, tag, r, rstr(r));
    if (req) {
      op->req = req;
      op->posted = 1;
      return 0;
    }
    if (nulls) (*nulls)++;
    for (int i = 0; i < nothers; i++)
      if (poll_op(c, others[i], what)) return -1;
    if (check_abort(c)) return -1;
    if (now_ns() > deadline)
      return failf(c, "%s: isend(size %zu) kept returning a NULL request for %.0f ms", what, size, ms_since(t0));
    backoff(&spins);
  }
}

static int post_irecv(rctx_t* c, void* rc, int n, void** data, size_t* sizes, int* tags, void** mhs, op_t* op,
                      op_t** others, int nothers, int* nulls, const char* what) {
  op_reset(op);
  int64_t deadline = op_deadline(c), t0 = now_ns();
  int spins = 0;
  for (;;) {
    void* req = NULL;
    ncclResult_t r = net_irecv(&c->net, rc, n, data, sizes, tags, mhs, &req);
    if (r != ncclSuccess) return failf(c, "%s: irecv(n %d, size[0] %zu) returned %d (%s)", what, n, sizes[0], r, rstr(r));
    if (req) {
      op->req = req;
      op->posted = 1;
      return 0;
    }
    if (nulls) (*nulls)++;
    for (int i = 0; i < nothers; i++)
      if (poll_op(c, others[i], what)) return -1;
    if (check_abort(c)) return -1;
    if (now_ns() > deadline)
      return failf(c, "%s: irecv kept returning a NULL request for %.0f ms", what, ms_since(t0));
    backoff(&spins);
  }
}

static int flush_nulls, flush_reqs; /* iflush statistics for details */

static int do_flush(rctx_t* c, void* rc, int n, void** data, int* sizes, void** mhs, const char* what) {
  void* req = NULL;
  stagef(c, "%s: iflush", what);
  ncclResult_t r = net_iflush(&c->net, rc, n, data, sizes, mhs, &req);
  if (r != ncclSuccess) return failf(c, "%s: iflush returned %d (%s)", what, r, rstr(r));
  if (req == NULL) {
    flush_nulls++;
    return 0;
  }
  flush_reqs++;
  op_t op;
  op_reset(&op);
  op.req = req;
  op.posted = 1;
  op.is_flush = 1; /* test(req, &done, NULL) */
  op_t* ops[1] = {&op};
  return wait_ops(c, ops, 1, what);
}

/* Checks one received buffer: reported size, data, and the canary after the message. */
static int verify_buf(rctx_t* c, const char* what, const unsigned char* buf, size_t cap, size_t expect, uint64_t seed,
                      int got_size) {
  if (got_size != (int)expect)
    return failf(c, "%s: test() reported %d bytes received, expected %zu", what, got_size, expect);
  size_t nbad = 0;
  long bad = pat_check(buf, expect, seed, &nbad);
  if (bad >= 0)
    return failf(c, "%s: data mismatch at byte offset %ld of %zu: got 0x%02x expected 0x%02x (%zu bytes differ)", what,
                 bad, expect, buf[bad], pat_byte(seed, (size_t)bad), nbad);
  for (size_t i = expect; i < cap; i++)
    if (buf[i] != CANARY)
      return failf(c, "%s: receive buffer written past the message end: offset %zu (message %zu B, buffer %zu B) = 0x%02x",
                   what, i, expect, cap, buf[i]);
  return 0;
}

static int check_sizes_tail(rctx_t* c, const char* what, const op_t* op, int n) {
  for (int i = n; i < NCCL_PROXY_MAX_SUBS; i++)
    if (op->sizes[i] != -1)
      return failf(c, "%s: test() wrote sizes[%d]=%d although the receive had n=%d buffers", what, i, op->sizes[i], n);
  return 0;
}

typedef struct {
  void* comm;
  void* mh;
  unsigned char* buf;
  size_t size; /* send: message size; recv: expected message size */
  size_t cap;  /* recv: buffer capacity */
  uint64_t seed;
  int tag;
} side_t;

/* One message out on s (if any) and one in on r (if any), both verified. The caller fills the send
 * buffer; the receive buffer is set to the canary here. */
static int xfer_step(rctx_t* c, const side_t* s, const side_t* r, int flush, const char* what) {
  op_t sop, rop;
  op_reset(&sop);
  op_reset(&rop);
  void* rdata = NULL;
  void* rmh = NULL;
  size_t rcap = 0;
  int rtag = 0;
  if (r) {
    memset(r->buf, CANARY, r->cap);
    rdata = r->buf;
    rmh = r->mh;
    rcap = r->cap;
    rtag = r->tag;
    stagef(c, "%s: irecv", what);
    if (post_irecv(c, r->comm, 1, &rdata, &rcap, &rtag, &rmh, &rop, NULL, 0, NULL, what)) return -1;
  }
  if (s) {
    op_t* others[1] = {&rop};
    stagef(c, "%s: isend", what);
    if (post_isend(c, s->comm, s->buf, s->size, s->tag, s->mh, &sop, others, r ? 1 : 0, NULL, what)) return -1;
  }
  op_t* ops[2];
  int n = 0;
  if (s) ops[n++] = &sop;
  if (r) ops[n++] = &rop;
  if (wait_ops(c, ops, n, what)) return -1;
  if (s && sop.sizes[0] != (int)s->size)
    return failf(c, "%s: send test() reported %d bytes sent, expected %zu", what, sop.sizes[0], s->size);
  if (r) {
    if (check_sizes_tail(c, what, &rop, 1)) return -1;
    if (flush) {
      int fs = rop.sizes[0];
      if (do_flush(c, r->comm, 1, &rdata, &fs, &rmh, what)) return -1;
    }
    if (verify_buf(c, what, r->buf, r->cap, r->size, r->seed, rop.sizes[0])) return -1;
  }
  return 0;
}

static int regmr(rctx_t* c, void* comm, void* buf, size_t size, void** mh, const char* what) {
  *mh = NULL;
  stagef(c, "%s: regMr(%zu B)", what, size);
  ncclResult_t r = net_regmr(&c->net, comm, buf, size, NCCL_PTR_HOST, mh);
  if (r != ncclSuccess) return failf(c, "%s: regMr(%zu B, NCCL_PTR_HOST) returned %d (%s)", what, size, r, rstr(r));
  return 0;
}

static int deregmr(rctx_t* c, void* comm, void* mh, const char* what) {
  stagef(c, "%s: deregMr", what);
  ncclResult_t r = net_deregmr(&c->net, comm, mh);
  if (r != ncclSuccess) return failf(c, "%s: deregMr returned %d (%s)", what, r, rstr(r));
  return 0;
}

static int close_send(rctx_t* c, void* sc, const char* what) {
  stagef(c, "%s: closeSend", what);
  ncclResult_t r = net_close_send(&c->net, sc);
  if (r != ncclSuccess) return failf(c, "%s: closeSend returned %d (%s)", what, r, rstr(r));
  return 0;
}

static int close_recv(rctx_t* c, void* rc, const char* what) {
  stagef(c, "%s: closeRecv", what);
  ncclResult_t r = net_close_recv(&c->net, rc);
  if (r != ncclSuccess) return failf(c, "%s: closeRecv returned %d (%s)", what, r, rstr(r));
  return 0;
}

/* Both ranks of a 2-rank scenario get one sendComm to the peer and one recvComm from it. */
static int pair_both_ways(rctx_t* c, void** sc, void** rc, int slot_base, unsigned seq, const char* what) {
  unsigned char mine[HSIZE], peer[1][HSIZE];
  void* lc[1];
  if (do_listen(c, mine, &lc[0])) return -1;
  publish(c, slot_base + c->hc.rank, seq, mine);
  if (fetch(c, slot_base + (1 - c->hc.rank), seq, peer[0], "peer's listen handle")) return -1;
  return establish(c, 1, peer, sc, 1, lc, rc, what);
}

/* One direction: rank 1 listens and receives, rank 0 connects and sends. */
static int pair_one_way(rctx_t* c, void** sc, void** rc, int slot, unsigned seq, const char* what) {
  unsigned char h[1][HSIZE];
  void* lc[1];
  *sc = *rc = NULL;
  if (c->hc.rank == 1) {
    if (do_listen(c, h[0], &lc[0])) return -1;
    publish(c, slot, seq, h[0]);
    return establish(c, 0, NULL, NULL, 1, lc, rc, what);
  }
  if (fetch(c, slot, seq, h[0], "rank 1's listen handle")) return -1;
  return establish(c, 1, h, sc, 0, NULL, NULL, what);
}

/* One process: a sendComm and a recvComm connected to each other (NCCL's GDR probe pattern). */
static int pair_loopback(rctx_t* c, void** sc, void** rc, const char* what) {
  unsigned char h[1][HSIZE];
  void* lc[1];
  if (do_listen(c, h[0], &lc[0])) return -1;
  return establish(c, 1, h, sc, 1, lc, rc, what);
}

/* ================================================================================ scenarios */

/* ---------------------------------------------------------------------------------- symbols */

static void check_members(net_t* n, errs_t* e) {
  int v = n->version;
#define REQ(t, m) \
  if (!(t)->m) add_err(e, "v%d: member %s is NULL", v, #m)
#define REQ_ALL(t)         \
  do {                     \
    REQ(t, init);          \
    REQ(t, devices);       \
    REQ(t, getProperties); \
    REQ(t, listen);        \
    REQ(t, connect);       \
    REQ(t, accept);        \
    REQ(t, regMr);         \
    REQ(t, regMrDmaBuf);   \
    REQ(t, deregMr);       \
    REQ(t, isend);         \
    REQ(t, irecv);         \
    REQ(t, iflush);        \
    REQ(t, test);          \
    REQ(t, closeSend);     \
    REQ(t, closeRecv);     \
    REQ(t, closeListen);   \
  } while (0)
  switch (v) {
    case 6: REQ_ALL(n->t6); break;
    case 7: REQ_ALL(n->t7); break;
    case 8: REQ_ALL(n->t8); break;
    case 9: REQ_ALL(n->t9); break;
    case 10: REQ_ALL(n->t10); break;
    case 11: REQ_ALL(n->t11); REQ(n->t11, finalize); break;
    case 12: REQ_ALL(n->t12); REQ(n->t12, finalize); break;
  }
#undef REQ_ALL
#undef REQ
}

static void check_props(int v, int dev, int ndev, const net_props_t* p, errs_t* e) {
  if (p->name == NULL) add_err(e, "v%d dev %d: name is NULL", v, dev);
  else if (strnlen(p->name, 256) == 0 || strnlen(p->name, 256) >= 256)
    add_err(e, "v%d dev %d: name is empty or not terminated", v, dev);
  if (!(p->ptrSupport & NCCL_PTR_HOST)) add_err(e, "v%d dev %d: ptrSupport 0x%x lacks NCCL_PTR_HOST", v, dev, p->ptrSupport);
  if (p->ptrSupport & (NCCL_PTR_CUDA | NCCL_PTR_DMABUF))
    add_err(e, "v%d dev %d: ptrSupport 0x%x advertises CUDA/DMABUF (host-only plugin)", v, dev, p->ptrSupport);
  if (p->speed <= 0) add_err(e, "v%d dev %d: speed %d <= 0", v, dev, p->speed);
  if (!(p->latency >= 0.0f) || isinf(p->latency)) add_err(e, "v%d dev %d: latency %g invalid", v, dev, (double)p->latency);
  if (p->maxComms <= 0) add_err(e, "v%d dev %d: maxComms %d <= 0", v, dev, p->maxComms);
  if (v == 6) {
    if (p->maxRecvs < 1 || p->maxRecvs > NCCL_NET_MAX_REQUESTS_V6)
      add_err(e, "v6 dev %d: maxRecvs %d not in [1, 8]", dev, p->maxRecvs);
  } else if (p->maxRecvs != 8) {
    add_err(e, "v%d dev %d: maxRecvs %d, expected 8", v, dev, p->maxRecvs);
  }
  if (v >= 7) {
    if (p->netDeviceType != NCCL_NET_DEVICE_HOST) add_err(e, "v%d dev %d: netDeviceType %d, expected HOST (0)", v, dev, p->netDeviceType);
    if (p->netDeviceVersion != 0) add_err(e, "v%d dev %d: netDeviceVersion %d, expected 0", v, dev, p->netDeviceVersion);
  }
  if (v >= 8 && p->regIsGlobal != 0 && p->regIsGlobal != 1)
    add_err(e, "v%d dev %d: regIsGlobal %d not 0/1", v, dev, p->regIsGlobal);
  if (v >= 9) {
    if (p->forceFlush != 0 && p->forceFlush != 1) add_err(e, "v%d dev %d: forceFlush %d not 0/1", v, dev, p->forceFlush);
    if (p->maxP2pBytes == 0 || p->maxP2pBytes > NCCL_MAX_NET_SIZE_BYTES)
      add_err(e, "v%d dev %d: maxP2pBytes %zu not in (0, 1 TiB]", v, dev, p->maxP2pBytes);
    if (p->maxCollBytes == 0 || p->maxCollBytes > NCCL_MAX_NET_SIZE_BYTES)
      add_err(e, "v%d dev %d: maxCollBytes %zu not in (0, 1 TiB]", v, dev, p->maxCollBytes);
    int maxv = v >= 12 ? NCCL_NET_MAX_DEVS_PER_NIC_V12 : NCCL_NET_MAX_DEVS_PER_NIC_V9;
    if (p->vndevs < 0 || p->vndevs > maxv) add_err(e, "v%d dev %d: vProps.ndevs %d not in [0, %d]", v, dev, p->vndevs, maxv);
    else
      for (int i = 0; i < p->vndevs; i++)
        if (p->vdevs[i] < 0 || p->vdevs[i] >= ndev)
          add_err(e, "v%d dev %d: vProps.devs[%d] = %d not a device index", v, dev, i, p->vdevs[i]);
  }
  if (v >= 11 && p->maxMultiRequestSize < 1)
    add_err(e, "v%d dev %d: maxMultiRequestSize %d < 1", v, dev, p->maxMultiRequestSize);
  if (v >= 11 && g_expect_multi > 0 && p->maxMultiRequestSize != g_expect_multi)
    add_err(e, "v%d dev %d: maxMultiRequestSize %d, expected %d (--expect-multi)", v, dev, p->maxMultiRequestSize,
            g_expect_multi);
  if (v >= 12) {
    /* Nothing fabricoll can read names a rail or a plane: both must be NCCL_NET_ID_UNDEF. */
    if (p->railId != -1) add_err(e, "v12 dev %d: railId %d, expected -1 (undefined)", dev, p->railId);
    if (p->planeId != -1) add_err(e, "v12 dev %d: planeId %d, expected -1 (undefined)", dev, p->planeId);
  }
}

static int scn_symbols(rctx_t* c) {
  errs_t e = {{0}, 0};
  stagef(c, "dlopen %s", g_lib);
  dlerror();
  void* dl = dlopen(g_lib, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    const char* de = dlerror();
    return failf(c, "dlopen(%s) failed: %s", g_lib, de ? de : "?");
  }
  net_props_t ref;
  memset(&ref, 0, sizeof ref);
  int have_ref = 0, ndev0 = 0, setattr_null = 0;
  char names[64] = "";
  for (int v = NET_MIN_VERSION; v <= NET_MAX_VERSION; v++) {
    net_t n;
    char err[512];
    stagef(c, "dlsym %s", net_symbol_name(v));
    if (net_bind(&n, dl, v, err, sizeof err) != 0) {
      add_err(&e, "%s", err);
      continue;
    }
    const char* name = *(const char* const*)n.table; /* member 1 of every version */
    if (name == NULL || strcmp(name, "fabricoll") != 0)
      add_err(&e, "%s.name is \"%s\", expected \"fabricoll\"", net_symbol_name(v), name ? name : "(null)");
    int before = e.count;
    check_members(&n, &e);
    if (e.count != before) continue;
    stagef(c, "v%d init", v);
    ncclResult_t r = net_init(&n, 0xfab0c000ULL + (uint64_t)v);
    if (r != ncclSuccess) {
      add_err(&e, "v%d init returned %d (%s)", v, r, rstr(r));
      continue;
    }
    if (v >= 11 && n.ctx == NULL) vlog("v%d init left ctx NULL (allowed)\n", v);
    int ndev = -1;
    stagef(c, "v%d devices", v);
    r = net_devices(&n, &ndev);
    if (r != ncclSuccess || ndev < 1) {
      add_err(&e, "v%d devices returned %d (%s), ndev %d", v, r, rstr(r), ndev);
    } else {
      if (v == NET_MAX_VERSION) ndev0 = ndev;
      for (int dev = 0; dev < ndev && dev < 4; dev++) {
        _Alignas(16) unsigned char buf[512];
        memset(buf, 0xCD, sizeof buf);
        stagef(c, "v%d getProperties(%d)", v, dev);
        r = net_get_props_raw(&n, dev, buf);
        if (r != ncclSuccess) {
          add_err(&e, "v%d getProperties(%d) returned %d (%s)", v, dev, r, rstr(r));
          continue;
        }
        size_t sz = net_props_size(v);
        for (size_t i = sz; i < sizeof buf; i++)
          if (buf[i] != 0xCD) {
            add_err(&e, "v%d getProperties(%d) wrote past sizeof(ncclNetProperties_v%d_t) = %zu (byte %zu changed)", v,
                    dev, v, sz, i);
            break;
          }
        net_props_t p;
        net_props_decode(v, buf, &p);
        check_props(v, dev, ndev, &p, &e);
        if (dev == 0) {
          if (!have_ref) {
            ref = p;
            have_ref = 1;
          } else {
            if (p.name && ref.name && strcmp(p.name, ref.name) != 0)
              add_err(&e, "v%d dev 0 name \"%s\" differs from v6's \"%s\"", v, p.name, ref.name);
            if (p.speed != ref.speed) add_err(&e, "v%d dev 0 speed %d differs from v6's %d", v, p.speed, ref.speed);
            if (p.guid != ref.guid) add_err(&e, "v%d dev 0 guid differs from v6's", v);
          }
        }
      }
    }
    if (v >= 11) {
      ncclResult_t (*setNetAttr)(void*, ncclNetAttr_v11_t*) = v == 11 ? n.t11->setNetAttr : n.t12->setNetAttr;
      if (setNetAttr) {
        ncclNetAttr_v11_t attr;
        memset(&attr, 0, sizeof attr);
        attr.sendCommAttr.maxConcurrentPeers = attr.recvCommAttr.maxConcurrentPeers = 8;
        attr.sendCommAttr.minConcurrentPeers = attr.recvCommAttr.minConcurrentPeers = 1;
        attr.sendCommAttr.maxFlowsPerPeer = attr.recvCommAttr.maxFlowsPerPeer = 2;
        attr.sendCommAttr.minFlowsPerPeer = attr.recvCommAttr.minFlowsPerPeer = 1;
        attr.op = 1u << 4; /* AllReduce */
        attr.algo = 1u << 1; /* RING */
        attr.proto = 1u << 2; /* SIMPLE */
        stagef(c, "v%d setNetAttr", v);
        r = setNetAttr(n.ctx, &attr);
        if (r != ncclSuccess) add_err(&e, "v%d setNetAttr (a hint) returned %d (%s)", v, r, rstr(r));
      } else {
        setattr_null++;
      }
      /* a second communicator's context alongside the first, as NCCL does per comm */
      net_t n2 = n;
      n2.ctx = NULL;
      n2.initialized = 0;
      stagef(c, "v%d second init (another commId)", v);
      r = net_init(&n2, 0xfab0d000ULL + (uint64_t)v);
      if (r != ncclSuccess) {
        add_err(&e, "v%d second init (another communicator) returned %d (%s)", v, r, rstr(r));
      } else {
        stagef(c, "v%d finalize second ctx", v);
        r = net_finalize(&n2);
        if (r != ncclSuccess) add_err(&e, "v%d finalize(second ctx) returned %d (%s)", v, r, rstr(r));
      }
    }
    stagef(c, "v%d finalize", v);
    r = net_finalize(&n);
    if (r != ncclSuccess) add_err(&e, "v%d finalize returned %d (%s)", v, r, rstr(r));
    snprintf(names + strlen(names), sizeof names - strlen(names), "%sv%d", names[0] ? "," : "", v);
  }
  long bad = atomic_load(&net_logger_bad_calls);
  if (bad) add_err(&e, "the plugin called the logger %ld times with a NULL format or a bad level", bad);
  if (e.count) return failf(c, "%d problems: %s", e.count, e.text);
  if (have_ref)
    detailf(c, "%s ok; ndev=%d; dev0 \"%s\" speed %d Mbps latency %.1f us maxComms %d maxRecvs %d ptrSupport 0x%x%s; "
               "logger calls %ld%s",
            names, ndev0, ref.name ? ref.name : "?", ref.speed, (double)ref.latency, ref.maxComms, ref.maxRecvs,
            ref.ptrSupport, ref.pciPath ? "" : " pciPath NULL", atomic_load(&net_logger_calls),
            setattr_null ? "; setNetAttr NULL" : "");
  return 0;
}

/* ---------------------------------------------------------------------------------- connect2 */

static int scn_connect2(rctx_t* c) {
  if (std_setup(c, 0xc0002)) return -1;
  void *sc = NULL, *rc = NULL;
  int64_t t0 = now_ns();
  if (pair_one_way(c, &sc, &rc, 0, 1, "connect2")) return -1;
  double ms = ms_since(t0);
  if (sync_ranks(c, "connected")) return -1;
  if (c->hc.rank == 0 && close_send(c, sc, "connect2")) return -1;
  if (c->hc.rank == 1 && close_recv(c, rc, "connect2")) return -1;
  if (sync_ranks(c, "closed")) return -1;
  if (std_teardown(c)) return -1;
  detailf(c, "%s in %.1f ms", c->hc.rank == 0 ? "connect" : "accept", ms);
  return 0;
}

/* ---------------------------------------------------------------------------------- connect1 */

static int scn_connect1(rctx_t* c) {
  if (std_setup(c, 0xc0001)) return -1;
  c->net.devcomm_null = 1; /* NCCL's GDR probe passes NULL devComm pointers */
  unsigned char h[2][HSIZE];
  void *lc[2], *sc[2], *rc[2];
  if (do_listen(c, h[0], &lc[0]) || do_listen(c, h[1], &lc[1])) return -1;
  int64_t t0 = now_ns();
  if (establish(c, 2, h, sc, 2, lc, rc, "connect1 (one thread, connect/accept alternately)")) return -1;
  double ms = ms_since(t0);
  const size_t size = MIB;
  unsigned char *sb[2], *rb[2];
  void *smh[2], *rmh[2];
  for (int i = 0; i < 2; i++) {
    sb[i] = xalloc(c, size, "send buffer");
    rb[i] = xalloc(c, size + 64, "recv buffer");
    if (!sb[i] || !rb[i]) return -1;
    if (regmr(c, sc[i], sb[i], size, &smh[i], "connect1") || regmr(c, rc[i], rb[i], size + 64, &rmh[i], "connect1"))
      return -1;
  }
  for (int i = 0; i < 2; i++) {
    char what[64];
    snprintf(what, sizeof what, "connect1 1 MiB over loopback pair %d", i);
    uint64_t seed = seed_of(1, (uint64_t)i, size);
    pat_fill(sb[i], size, seed);
    side_t s = {sc[i], smh[i], sb[i], size, 0, 0, 7};
    side_t r = {rc[i], rmh[i], rb[i], size, size + 64, seed, 7};
    if (xfer_step(c, &s, &r, 0, what)) return -1;
  }
  for (int i = 0; i < 2; i++) {
    if (deregmr(c, sc[i], smh[i], "connect1") || deregmr(c, rc[i], rmh[i], "connect1")) return -1;
    if (close_send(c, sc[i], "connect1") || close_recv(c, rc[i], "connect1")) return -1;
    free(sb[i]);
    free(rb[i]);
  }
  if (std_teardown(c)) return -1;
  detailf(c, "2 loopback pairs in one thread in %.1f ms, 1 MiB verified on each", ms);
  return 0;
}

/* -------------------------------------------------------------------------------------- xfer */

static int scn_xfer(rctx_t* c) {
  if (std_setup(c, 0xc0003)) return -1;
  void *sc, *rc;
  if (pair_both_ways(c, &sc, &rc, 0, 1, "xfer setup")) return -1;
  static const size_t sizes[] = {0, 1, 7, 8, 4095, 4096, 65536, MIB + 3, 4 * MIB, 64 * MIB};
  const int nsizes = (int)(sizeof sizes / sizeof sizes[0]);
  int skipped = 0;
  int64_t t0 = now_ns();
  for (int flush = 0; flush <= 1; flush++) {
    for (int i = 0; i < nsizes; i++) {
      size_t size = sizes[i];
      if (c->net.version >= 9 && size > c->props.maxP2pBytes) {
        skipped++;
        continue;
      }
      char what[96];
      snprintf(what, sizeof what, "xfer size %zu%s", size, flush ? " +iflush" : "");
      unsigned char* sb = xalloc(c, size + 64, "send buffer");
      unsigned char* rb = xalloc(c, size + 64, "recv buffer");
      if (!sb || !rb) return -1;
      void *smh, *rmh;
      if (regmr(c, sc, sb, size + 64, &smh, what) || regmr(c, rc, rb, size + 64, &rmh, what)) return -1;
      uint64_t sseed = seed_of(size, (uint64_t)c->hc.rank, (uint64_t)flush);
      uint64_t rseed = seed_of(size, (uint64_t)(1 - c->hc.rank), (uint64_t)flush);
      pat_fill(sb, size, sseed);
      side_t s = {sc, smh, sb, size, 0, 0, 0x100 + c->hc.rank};
      side_t r = {rc, rmh, rb, size, size + 64, rseed, 0x100 + (1 - c->hc.rank)};
      if (xfer_step(c, &s, &r, flush, what)) return -1;
      if (deregmr(c, sc, smh, what) || deregmr(c, rc, rmh, what)) return -1;
      free(sb);
      free(rb);
    }
  }
  double ms = ms_since(t0);
  if (sync_ranks(c, "xfer done")) return -1;
  if (close_send(c, sc, "xfer") || close_recv(c, rc, "xfer")) return -1;
  if (std_teardown(c)) return -1;
  detailf(c, "%d sizes 0..64 MiB x {plain, iflush} both ways in %.0f ms; iflush: %d NULL requests, %d tested%s",
          nsizes, ms, flush_nulls, flush_reqs, skipped ? "; some sizes > maxP2pBytes skipped" : "");
  return 0;
}

/* ------------------------------------------------------------------------------------- group */

static void shuffle(int* a, int n, uint64_t seed) {
  for (int i = 0; i < n; i++) a[i] = i;
  for (int i = n - 1; i > 0; i--) {
    seed = mix64(seed + (uint64_t)i);
    int j = (int)(seed % (uint64_t)(i + 1));
    int t = a[i];
    a[i] = a[j];
    a[j] = t;
  }
}

#define GMAX 64

/* What a stuck grouped receive has in its buffers: untouched (canary), complete or partial. */
typedef struct {
  int nbuf;
  unsigned char** buf;
  const size_t* expect;
  const uint64_t* seed;
  const int* tags;
} gdiag_t;

static void group_diag(rctx_t* c, char* out, size_t len) {
  const gdiag_t* g = c->diag_arg;
  size_t used = 0;
  for (int i = 0; i < g->nbuf && used + 80 < len; i++) {
    const char* st;
    size_t nbad = 0;
    long bad = pat_check(g->buf[i], g->expect[i], g->seed[i], &nbad);
    if (bad < 0 && (g->expect[i] == 0 ? g->buf[i][0] == CANARY : 1)) st = g->expect[i] ? "complete" : "empty(ok?)";
    else if (nbad == g->expect[i] && g->buf[i][0] == CANARY) st = "untouched";
    else st = "partial";
    used += (size_t)snprintf(out + used, len - used, "%sbuf %d tag %d %zu B: %s", i ? ", " : "buffers: ", i,
                             g->tags[i], g->expect[i], st);
    if (strcmp(st, "partial") == 0) {
      size_t own = 0, can = 0;
      for (size_t k = 0; k < g->expect[i]; k++) {
        own += g->buf[i][k] == pat_byte(g->seed[i], k);
        can += g->buf[i][k] == CANARY;
      }
      used += (size_t)snprintf(out + used, len - used, " [%zu B own data, %zu B canary]", own, can);
    }
    if (strcmp(st, "partial") == 0 || strcmp(st, "untouched") == 0)
      for (int j = 0; j < g->nbuf && used + 64 < len; j++) /* holds another buffer's message? */
        if (j != i && g->expect[j] > 0 && g->expect[j] <= g->expect[i] &&
            pat_check(g->buf[i], g->expect[j], g->seed[j], NULL) < 0)
          used += (size_t)snprintf(out + used, len - used, " (holds the %zu-B message for tag %d)", g->expect[j],
                                   g->tags[j]);
  }
}

static size_t group_size(int n, int round, int i) {
  static const size_t base[8] = {1, 4096, 100000, 0, 65537, 257, MIB, 31};
  size_t b = base[(i + n + round * 3) % 8];
  return b == 0 ? 0 : b + (size_t)i * 3 + (size_t)round;
}

static int scn_group(rctx_t* c) {
  if (std_setup(c, 0xc0004)) return -1;
  void *sc, *rc;
  if (pair_one_way(c, &sc, &rc, 0, 1, "group setup")) return -1;
  int maxr = c->props.maxRecvs;
  if (maxr > GMAX) maxr = GMAX;
  const size_t cap = MIB + 256;
  unsigned char* buf[2][GMAX];
  void* mh[2][GMAX];
  void* comm = c->hc.rank == 0 ? sc : rc;
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < maxr; i++) {
      buf[k][i] = xalloc(c, cap, "group buffer");
      if (!buf[k][i] || regmr(c, comm, buf[k][i], cap, &mh[k][i], "group")) return -1;
    }
  int tags[GMAX];
  /* Part 1: one grouped receive of n buffers, n = 1..maxRecvs; sends in shuffled order. */
  for (int n = 1; n <= maxr; n++) {
    char what[96];
    snprintf(what, sizeof what, "group n=%d", n);
    for (int i = 0; i < n; i++) tags[i] = 1000 + n * 100 + i * 7;
    if (c->hc.rank == 1) {
      void* data[GMAX];
      size_t caps[GMAX];
      void* mhs[GMAX];
      for (int i = 0; i < n; i++) {
        memset(buf[0][i], CANARY, cap);
        data[i] = buf[0][i];
        caps[i] = group_size(n, 0, i) + 16 + (size_t)i;
        mhs[i] = mh[0][i];
      }
      op_t op;
      if (post_irecv(c, rc, n, data, caps, tags, mhs, &op, NULL, 0, NULL, what)) return -1;
      op_t* ops[1] = {&op};
      size_t expect[GMAX];
      uint64_t seeds[GMAX];
      for (int i = 0; i < n; i++) expect[i] = group_size(n, 0, i), seeds[i] = seed_of(n, i, 0);
      gdiag_t gd = {n, buf[0], expect, seeds, tags};
      c->diag = group_diag;
      c->diag_arg = &gd;
      int wr = wait_ops(c, ops, 1, what);
      c->diag = NULL;
      if (wr) return -1;
      if (check_sizes_tail(c, what, &op, n)) return -1;
      for (int i = 0; i < n; i++) {
        char w2[128];
        snprintf(w2, sizeof w2, "%s buffer %d (tag %d)", what, i, tags[i]);
        if (verify_buf(c, w2, buf[0][i], caps[i], group_size(n, 0, i), seed_of(n, i, 0), op.sizes[i])) return -1;
      }
    } else {
      int order[GMAX];
      shuffle(order, n, (uint64_t)n * 77);
      op_t ops[GMAX];
      op_t* po[GMAX];
      for (int k = 0; k < n; k++) {
        int i = order[k];
        pat_fill(buf[0][i], group_size(n, 0, i), seed_of(n, i, 0));
        if (post_isend(c, sc, buf[0][i], group_size(n, 0, i), tags[i], mh[0][i], &ops[k], po, k, NULL, what)) return -1;
        po[k] = &ops[k];
      }
      if (wait_ops(c, po, n, what)) return -1;
      for (int k = 0; k < n; k++)
        if (ops[k].sizes[0] != (int)group_size(n, 0, order[k]))
          return failf(c, "%s: send of buffer %d reported %d bytes, expected %zu", what, order[k], ops[k].sizes[0],
                       group_size(n, 0, order[k]));
    }
  }
  /* Part 2: two grouped receives outstanding with the same tags: matching is in posted order,
   * so round 1's sends fill the first, round 2's the second. */
  {
    int n = maxr;
    const char* what = "group posted-order (2 receives, same tags)";
    for (int i = 0; i < n; i++) tags[i] = 5000 + i * 3;
    if (c->hc.rank == 1) {
      void* data[2][GMAX];
      size_t caps[2][GMAX];
      void* mhs[2][GMAX];
      op_t op[2];
      op_t* po[2] = {&op[0], &op[1]};
      for (int k = 0; k < 2; k++) {
        for (int i = 0; i < n; i++) {
          memset(buf[k][i], CANARY, cap);
          data[k][i] = buf[k][i];
          caps[k][i] = MIB + 128;
          mhs[k][i] = mh[k][i];
        }
        if (post_irecv(c, rc, n, data[k], caps[k], tags, mhs[k], &op[k], po, k, NULL, what)) return -1;
      }
      if (wait_ops(c, po, 2, what)) return -1;
      for (int k = 0; k < 2; k++)
        for (int i = 0; i < n; i++) {
          char w2[160];
          snprintf(w2, sizeof w2, "%s: receive #%d buffer %d (tag %d)", what, k + 1, i, tags[i]);
          if (verify_buf(c, w2, buf[k][i], caps[k][i], group_size(100, k + 1, i), seed_of(100 + k, i, 1),
                         op[k].sizes[i]))
            return -1;
        }
    } else {
      op_t ops[2 * GMAX];
      op_t* po[2 * GMAX];
      int np = 0;
      for (int k = 0; k < 2; k++) {
        int order[GMAX];
        shuffle(order, n, 991 + (uint64_t)k);
        for (int j = 0; j < n; j++) {
          int i = order[j];
          size_t sz = group_size(100, k + 1, i);
          pat_fill(buf[k][i], sz, seed_of(100 + k, i, 1));
          if (post_isend(c, sc, buf[k][i], sz, tags[i], mh[k][i], &ops[np], po, np, NULL, what)) return -1;
          po[np] = &ops[np];
          np++;
        }
      }
      if (wait_ops(c, po, np, what)) return -1;
    }
  }
  if (sync_ranks(c, "group done")) return -1;
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < maxr; i++) {
      if (deregmr(c, comm, mh[k][i], "group")) return -1;
      free(buf[k][i]);
    }
  if (c->hc.rank == 0 && close_send(c, sc, "group")) return -1;
  if (c->hc.rank == 1 && close_recv(c, rc, "group")) return -1;
  if (std_teardown(c)) return -1;
  detailf(c, "n=1..%d grouped receives with shuffled tagged sends, plus 2 outstanding same-tag groups in posted order",
          maxr);
  return 0;
}

/* ------------------------------------------------------------------------------------- multi */

/* NCCL's multi-request groups (net v11+), called as NCCL's convention says: every member but the
 * last with *request = NCCL_NET_MULTI_REQUEST on input (the plugin must leave NULL there); the
 * last with any other value, called again with the same buffer until it returns the one handle of
 * the whole group, whose test() reports done once every member is, with the group's bytes. */

#define MULTI_TAG 0x400

static ncclResult_t multi_call(rctx_t* c, int send, void* comm, void* buf, size_t size, int tag, void* mh,
                               void** req) {
  if (send) return net_isend(&c->net, comm, buf, size, tag, mh, req);
  void* data = buf;
  int tg = tag;
  void* m = mh;
  return net_irecv(&c->net, comm, 1, &data, &size, &tg, &m, req);
}

/* The k members of one group on comm (slice i: bufs + offs[i], sizes[i] bytes); *handle gets the
 * group's handle. */
static int multi_post(rctx_t* c, int send, void* comm, unsigned char* bufs, const size_t* offs, const size_t* sizes,
                      int k, int tag, void* mh, void** handle, const char* what) {
  const char* op = send ? "isend" : "irecv";
  for (int i = 0; i < k - 1; i++) {
    void* req = (void*)NCCL_NET_MULTI_REQUEST;
    ncclResult_t r = multi_call(c, send, comm, bufs + offs[i], sizes[i], tag, mh, &req);
    if (r != ncclSuccess) return failf(c, "%s: %s member %d of %d returned %d (%s)", what, op, i, k, r, rstr(r));
    if (req != NULL)
      return failf(c, "%s: %s member %d of %d (NCCL_NET_MULTI_REQUEST) set request %p, expected NULL", what, op, i, k,
                   req);
  }
  int64_t deadline = op_deadline(c), t0 = now_ns();
  int spins = 0;
  for (;;) {
    void* req = NULL;
    ncclResult_t r = multi_call(c, send, comm, bufs + offs[k - 1], sizes[k - 1], tag, mh, &req);
    if (r != ncclSuccess) return failf(c, "%s: %s last member (of %d) returned %d (%s)", what, op, k, r, rstr(r));
    if (req) {
      *handle = req;
      return 0;
    }
    if (check_abort(c)) return -1;
    if (now_ns() > deadline)
      return failf(c, "%s: the last %s member (group of %d) kept returning NULL for %.0f ms", what, op, k, ms_since(t0));
    backoff(&spins);
  }
}

/* One group of k each way: this rank receives the peer's k messages as one group and sends k as
 * one group; both handles tested to done; bytes, sizes and canaries checked. */
static int multi_round(rctx_t* c, void* sc, void* rc, int k, int round) {
  char what[96];
  snprintf(what, sizeof what, "multi group of %d (round %d)", k, round);
  int me = c->hc.rank, peer = 1 - me;
  size_t* soff = calloc((size_t)k, sizeof *soff);
  size_t* roff = calloc((size_t)k, sizeof *roff);
  size_t* ssz = calloc((size_t)k, sizeof *ssz);
  size_t* rsz = calloc((size_t)k, sizeof *rsz);
  size_t* rcap = calloc((size_t)k, sizeof *rcap);
  if (!soff || !roff || !ssz || !rsz || !rcap) return failf(c, "%s: out of memory", what);
  size_t stot = 0, rtot = 0, sall = 0, rall = 0;
  for (int i = 0; i < k; i++) {
    ssz[i] = group_size(k, round + me, i);
    rsz[i] = group_size(k, round + peer, i);
    rcap[i] = rsz[i] + 64;
    soff[i] = sall, roff[i] = rall;
    sall += ssz[i], rall += rcap[i];
    stot += ssz[i], rtot += rsz[i];
  }
  unsigned char* sb = xalloc(c, sall + 1, "multi send buffer");
  unsigned char* rb = xalloc(c, rall, "multi recv buffer");
  if (!sb || !rb) return -1;
  for (int i = 0; i < k; i++) pat_fill(sb + soff[i], ssz[i], seed_of((uint64_t)k, (uint64_t)i, (uint64_t)(round + me)));
  memset(rb, CANARY, rall);
  void *smh, *rmh;
  if (regmr(c, sc, sb, sall + 1, &smh, what) || regmr(c, rc, rb, rall, &rmh, what)) return -1;
  op_t sop, rop;
  op_reset(&sop);
  op_reset(&rop);
  /* The receive group with each member's capacity: multi_post passes sizes as capacities. */
  if (multi_post(c, 0, rc, rb, roff, rcap, k, MULTI_TAG + peer, rmh, &rop.req, what)) return -1;
  rop.posted = 1;
  if (multi_post(c, 1, sc, sb, soff, ssz, k, MULTI_TAG + me, smh, &sop.req, what)) return -1;
  sop.posted = 1;
  op_t* ops[2] = {&sop, &rop};
  if (wait_ops(c, ops, 2, what)) return -1;
  if (sop.sizes[0] != (int)stot)
    return failf(c, "%s: the send group's test() reported %d bytes, expected %zu (the sum)", what, sop.sizes[0], stot);
  if (rop.sizes[0] != (int)rtot)
    return failf(c, "%s: the receive group's test() reported %d bytes, expected %zu (the sum)", what, rop.sizes[0],
                 rtot);
  if (check_sizes_tail(c, what, &rop, 1)) return -1;
  for (int i = 0; i < k; i++) {
    char w2[128];
    snprintf(w2, sizeof w2, "%s member %d", what, i);
    if (verify_buf(c, w2, rb + roff[i], rcap[i], rsz[i], seed_of((uint64_t)k, (uint64_t)i, (uint64_t)(round + peer)),
                   (int)rsz[i]))
      return -1;
  }
  if (deregmr(c, sc, smh, what) || deregmr(c, rc, rmh, what)) return -1;
  free(sb), free(rb), free(soff), free(roff), free(ssz), free(rsz), free(rcap);
  return 0;
}

/* Rank 1's last member finds its comm full (M-2 plain receives + the group's first two): NULL,
 * again NULL with the same buffer (not appended twice), NULL for another buffer (not appended), a
 * hint refused; once rank 0 has sent, the same buffer gets the handle of a group of 4. */
static int multi_busy(rctx_t* c, void* sc, void* rc, int m) {
  const char* what = "multi busy last member";
  const int fill = m - 2, k = 4;
  static const size_t gsz[4] = {100, 4096, 0, 65537};
  size_t off[4], cap[4], tot = 0, all = 0;
  for (int i = 0; i < k; i++) off[i] = all, cap[i] = gsz[i] + 64, all += cap[i], tot += gsz[i];
  size_t fall = (size_t)fill * 8;
  unsigned char* fb = xalloc(c, fall + 16, "multi busy fill buffer");
  unsigned char* gb = xalloc(c, all + 64, "multi busy group buffer");
  op_t* fops = calloc((size_t)fill, sizeof *fops);
  op_t** fpo = calloc((size_t)fill + k, sizeof *fpo);
  if (!fb || !gb || !fops || !fpo) return -1;
  void *fmh, *gmh;
  void* comm = c->hc.rank == 0 ? sc : rc;
  if (regmr(c, comm, fb, fall + 16, &fmh, what) || regmr(c, comm, gb, all + 64, &gmh, what)) return -1;
  if (c->hc.rank == 1) {
    memset(gb, CANARY, all + 64);
    for (int i = 0; i < fill; i++) {
      void* d = fb + (size_t)i * 8;
      size_t s = 8;
      int t = MULTI_TAG + 0x10;
      if (post_irecv(c, rc, 1, &d, &s, &t, &fmh, &fops[i], NULL, 0, NULL, what)) return -1;
      fpo[i] = &fops[i];
    }
    for (int i = 0; i < k - 1; i++) {
      void* req = (void*)NCCL_NET_MULTI_REQUEST;
      ncclResult_t r = multi_call(c, 0, rc, gb + off[i], cap[i], MULTI_TAG + 0x11, gmh, &req);
      if (r != ncclSuccess || req) return failf(c, "%s: member %d returned %d, request %p", what, i, r, req);
    }
    for (int again = 0; again < 2; again++) {
      void* req = NULL;
      ncclResult_t r = multi_call(c, 0, rc, gb + off[k - 1], cap[k - 1], MULTI_TAG + 0x11, gmh, &req);
      if (r != ncclSuccess || req)
        return failf(c, "%s: call %d of the last member returned %d, request %p, on a full comm (expected NULL)", what,
                     again + 1, r, req);
    }
    void* req = (void*)NCCL_NET_MULTI_REQUEST;
    ncclResult_t r = multi_call(c, 0, rc, gb + all, 64, MULTI_TAG + 0x11, gmh, &req);
    if (r != ncclInvalidUsage)
      return failf(c, "%s: a hinted irecv after the last member returned %d (%s), expected ncclInvalidUsage", what, r,
                   rstr(r));
    req = NULL;
    r = multi_call(c, 0, rc, gb + all, 64, MULTI_TAG + 0x11, gmh, &req);
    if (r != ncclSuccess || req)
      return failf(c, "%s: another buffer while the last member waits returned %d, request %p", what, r, req);
    if (sync_ranks(c, "multi busy posted")) return -1;
    if (wait_ops(c, fpo, fill, what)) return -1;
    op_t gop;
    op_reset(&gop);
    int64_t deadline = op_deadline(c);
    int spins = 0;
    while (!gop.req) {
      r = multi_call(c, 0, rc, gb + off[k - 1], cap[k - 1], MULTI_TAG + 0x11, gmh, &gop.req);
      if (r != ncclSuccess) return failf(c, "%s: the last member returned %d (%s)", what, r, rstr(r));
      if (now_ns() > deadline) return failf(c, "%s: the last member never got the group's handle", what);
      if (!gop.req) backoff(&spins);
    }
    gop.posted = 1;
    op_t* gpo[1] = {&gop};
    if (wait_ops(c, gpo, 1, what)) return -1;
    if (gop.sizes[0] != (int)tot)
      return failf(c, "%s: test() reported %d bytes, expected %zu (4 members, the last once)", what, gop.sizes[0], tot);
    for (int i = 0; i < k; i++) {
      char w2[96];
      snprintf(w2, sizeof w2, "%s: member %d", what, i);
      if (verify_buf(c, w2, gb + off[i], cap[i], gsz[i], seed_of(77, (uint64_t)i, 1), (int)gsz[i])) return -1;
    }
    for (int i = 0; i < 64; i++)
      if (gb[all + (size_t)i] != CANARY) return failf(c, "%s: the other buffer was appended (byte %d written)", what, i);
  } else {
    if (sync_ranks(c, "multi busy posted")) return -1;
    op_t gops[4];
    for (int i = 0; i < fill; i++) {
      if (post_isend(c, sc, fb + (size_t)i * 8, 8, MULTI_TAG + 0x10, fmh, &fops[i], fpo, i, NULL, what)) return -1;
      fpo[i] = &fops[i];
    }
    for (int i = 0; i < k; i++) {
      pat_fill(gb + off[i], gsz[i], seed_of(77, (uint64_t)i, 1));
      if (post_isend(c, sc, gb + off[i], gsz[i], MULTI_TAG + 0x11, gmh, &gops[i], fpo, fill + i, NULL, what)) return -1;
      fpo[fill + i] = &gops[i];
    }
    if (wait_ops(c, fpo, fill + k, what)) return -1;
  }
  if (deregmr(c, comm, fmh, what) || deregmr(c, comm, gmh, what)) return -1;
  free(fb), free(gb), free(fops), free(fpo);
  return 0;
}

/* On a loopback pair: a group one larger than maxMultiRequestSize is refused at its M-th hinted
 * member; groups still open at close (send and receive) go with their comm. */
static int multi_misuse(rctx_t* c, int m) {
  const char* what = "multi misuse";
  void *sc, *rc;
  if (pair_loopback(c, &sc, &rc, what)) return -1;
  unsigned char b[64];
  for (int i = 0; i < m; i++) {
    void* req = (void*)NCCL_NET_MULTI_REQUEST;
    ncclResult_t r = net_isend(&c->net, sc, b, 0, MULTI_TAG + 0x20, NULL, &req);
    if (i < m - 1 && (r != ncclSuccess || req))
      return failf(c, "%s: hinted isend %d of %d returned %d, request %p", what, i, m, r, req);
    if (i == m - 1 && r != ncclInvalidUsage)
      return failf(c, "%s: hinted isend %d (a group of %d + its last > maxMultiRequestSize %d) returned %d (%s), "
                   "expected ncclInvalidUsage", what, i, m + 1, m, r, rstr(r));
  }
  for (int i = 0; i < 2; i++) {
    void* req = (void*)NCCL_NET_MULTI_REQUEST;
    void* d = b;
    size_t s = sizeof b;
    int t = MULTI_TAG + 0x21;
    void* mh = NULL;
    ncclResult_t r = net_irecv(&c->net, rc, 1, &d, &s, &t, &mh, &req);
    if (r != ncclSuccess || req) return failf(c, "%s: hinted irecv %d returned %d, request %p", what, i, r, req);
  }
  if (close_send(c, sc, "multi: a send group left open") || close_recv(c, rc, "multi: a receive group left open"))
    return -1;
  return 0;
}

static int scn_multi(rctx_t* c) {
  if (std_setup(c, 0xc0010)) return -1;
  if (c->net.version < 11) {
    if (std_teardown(c)) return -1;
    detailf(c, "v%d has no multi-request API: nothing to test", c->net.version);
    return 0;
  }
  int m = c->props.maxMultiRequestSize;
  if (m < 1 || m > 1024) return failf(c, "maxMultiRequestSize %d not in [1, 1024]", m);
  void *sc, *rc;
  if (pair_both_ways(c, &sc, &rc, 0, 1, "multi setup")) return -1;
  static const int ks[] = {1, 2, 3, 8, 32, -1, 0}; /* -1: M-1, 0: M */
  int nk = 0, done[8];
  for (int j = 0; j < (int)(sizeof ks / sizeof ks[0]); j++) {
    int k = ks[j] > 0 ? ks[j] : m + ks[j];
    if (k < 1 || k > m) continue;
    int dup = 0;
    for (int q = 0; q < nk; q++) dup |= done[q] == k;
    if (dup) continue;
    done[nk++] = k;
    if (multi_round(c, sc, rc, k, j)) return -1;
  }
  int busy = g_expect_multi > 0 && m >= 4;
  if (busy && multi_busy(c, sc, rc, m)) return -1;
  if (sync_ranks(c, "multi groups done")) return -1;
  if (m >= 2 && multi_misuse(c, m)) return -1;
  if (close_send(c, sc, "multi") || close_recv(c, rc, "multi")) return -1;
  if (std_teardown(c)) return -1;
  detailf(c, "maxMultiRequestSize %d: %d group sizes up to %d each way, sizes 0..1 MiB; %s%s", m, nk, done[nk - 1],
          busy ? "busy last member (same buffer, other buffer, late hint); " : "",
          m >= 2 ? "over-size group refused, open groups closed" : "no groups (size 1)");
  return 0;
}

/* --------------------------------------------------------------------------------- inflight32 */

#define NFLIGHT 32

static size_t flight_size(int i, int round) {
  static const size_t base[8] = {1, 100, 4096, 65536, 0, 262147, MIB, 17};
  size_t b = base[(i + round) % 8];
  return b == 0 ? 0 : b + (size_t)i;
}

static int scn_inflight32(rctx_t* c) {
  if (std_setup(c, 0xc0005)) return -1;
  void *sc, *rc;
  if (pair_one_way(c, &sc, &rc, 0, 1, "inflight32 setup")) return -1;
  const size_t cap = MIB + 256;
  void* comm = c->hc.rank == 0 ? sc : rc;
  unsigned char* buf[NFLIGHT];
  void* mh[NFLIGHT];
  for (int i = 0; i < NFLIGHT; i++) {
    buf[i] = xalloc(c, cap, "inflight buffer");
    if (!buf[i] || regmr(c, comm, buf[i], cap, &mh[i], "inflight32")) return -1;
  }
  int nulls = 0, min_refused_at = NFLIGHT;
  const int rounds = 3;
  for (int round = 0; round < rounds; round++) {
    char what[64];
    snprintf(what, sizeof what, "inflight32 round %d", round);
    op_t ops[NFLIGHT];
    op_t* po[NFLIGHT];
    size_t caps[NFLIGHT];
    stagef(c, "%s: posting %d %s", what, NFLIGHT, c->hc.rank == 0 ? "isends" : "irecvs");
    for (int i = 0; i < NFLIGHT; i++) {
      size_t sz = flight_size(i, round);
      caps[i] = sz + (size_t)(i % 3) * 64;
      void* data = buf[i];
      int tag = 42;
      if (c->hc.rank == 0) pat_fill(buf[i], sz, seed_of(32, i, round));
      else memset(buf[i], CANARY, cap);
      op_reset(&ops[i]);
      /* The plugin promises >= 32 requests in flight per comm: retry a NULL request for 1 s without
       * testing anything; only then fall back to testing the others (and record the violation). */
      int64_t t0 = now_ns(), deadline = op_deadline(c);
      int spins = 0, fallback = 0;
      for (;;) {
        void* req = NULL;
        ncclResult_t r = c->hc.rank == 0 ? net_isend(&c->net, sc, data, sz, tag, mh[i], &req)
                                      : net_irecv(&c->net, rc, 1, &data, &caps[i], &tag, &mh[i], &req);
        if (r != ncclSuccess)
          return failf(c, "%s: %s #%d (size %zu) returned %d (%s)", what, c->hc.rank == 0 ? "isend" : "irecv", i, sz, r,
                       rstr(r));
        if (req) {
          ops[i].req = req;
          ops[i].posted = 1;
          break;
        }
        nulls++;
        if (!fallback && now_ns() - t0 > 1000000000LL) {
          fallback = 1;
          if (i < min_refused_at) min_refused_at = i;
          fprintf(stderr, "[inflight32 rank %d] %s #%d: NULL request for 1 s with only %d outstanding; testing others\n",
                  c->hc.rank, c->hc.rank == 0 ? "isend" : "irecv", i, i);
        }
        if (fallback)
          for (int k = 0; k < i; k++)
            if (poll_op(c, &ops[k], what)) return -1;
        if (check_abort(c)) return -1;
        if (now_ns() > deadline) return failf(c, "%s: request #%d stayed NULL for %.0f ms", what, i, ms_since(t0));
        backoff(&spins);
      }
      po[i] = &ops[i];
    }
    if (wait_ops(c, po, NFLIGHT, what)) return -1;
    for (int i = 0; i < NFLIGHT; i++) {
      size_t sz = flight_size(i, round);
      char w2[96];
      snprintf(w2, sizeof w2, "%s message %d", what, i);
      if (c->hc.rank == 0) {
        if (ops[i].sizes[0] != (int)sz)
          return failf(c, "%s: send test() reported %d bytes, expected %zu", w2, ops[i].sizes[0], sz);
      } else if (verify_buf(c, w2, buf[i], caps[i], sz, seed_of(32, i, round), ops[i].sizes[0])) {
        return -1;
      }
    }
  }
  if (sync_ranks(c, "inflight32 done")) return -1;
  for (int i = 0; i < NFLIGHT; i++) {
    if (deregmr(c, comm, mh[i], "inflight32")) return -1;
    free(buf[i]);
  }
  if (c->hc.rank == 0 && close_send(c, sc, "inflight32")) return -1;
  if (c->hc.rank == 1 && close_recv(c, rc, "inflight32")) return -1;
  if (std_teardown(c)) return -1;
  if (min_refused_at < NFLIGHT)
    return failf(c, "%s refused a request (NULL for > 1 s) with only %d outstanding; the plugin promises >= 32 in flight",
                 c->hc.rank == 0 ? "isend" : "irecv", min_refused_at);
  detailf(c, "%d rounds of %d outstanding %s, %d NULL requests", rounds, NFLIGHT, c->hc.rank == 0 ? "isends" : "irecvs",
          nulls);
  return 0;
}

/* ----------------------------------------------------------------------------------- pairs16 */

#define NPAIRS 16

static size_t pair_size(int p, int r) {
  if ((p + r) % 7 == 0) return MIB + (size_t)p;
  return 1 + ((size_t)p * 7919 + (size_t)r * 104729) % 300000;
}

static int scn_pairs16(rctx_t* c) {
  if (std_setup(c, 0xc0006)) return -1;
  /* pair p: rank p%2 listens and receives, the other rank connects and sends */
  int rp[NPAIRS], sp[NPAIRS], nr = 0, ns = 0;
  for (int p = 0; p < NPAIRS; p++) {
    if (p % 2 == c->hc.rank) rp[nr++] = p;
    else sp[ns++] = p;
  }
  unsigned char myh[NPAIRS][HSIZE], peerh[NPAIRS][HSIZE];
  void *lc[NPAIRS], *rc[NPAIRS], *sc[NPAIRS];
  for (int k = 0; k < nr; k++) {
    if (do_listen(c, myh[k], &lc[k])) return -1;
    publish(c, rp[k], 1, myh[k]);
  }
  for (int k = 0; k < ns; k++)
    if (fetch(c, sp[k], 1, peerh[k], "peer's listen handle")) return -1;
  if (establish(c, ns, peerh, sc, nr, lc, rc, "pairs16 setup")) return -1;
  const size_t cap = MIB + 4096;
  unsigned char *sb[NPAIRS], *rb[NPAIRS];
  void *smh[NPAIRS], *rmh[NPAIRS];
  for (int k = 0; k < ns; k++) {
    sb[k] = xalloc(c, cap, "pairs16 send buffer");
    if (!sb[k] || regmr(c, sc[k], sb[k], cap, &smh[k], "pairs16")) return -1;
  }
  for (int k = 0; k < nr; k++) {
    rb[k] = xalloc(c, cap, "pairs16 recv buffer");
    if (!rb[k] || regmr(c, rc[k], rb[k], cap, &rmh[k], "pairs16")) return -1;
  }
  const int rounds = 10;
  for (int r = 0; r < rounds; r++) {
    char what[64];
    snprintf(what, sizeof what, "pairs16 round %d", r);
    op_t ops[2 * NPAIRS];
    op_t* po[2 * NPAIRS];
    int np = 0;
    size_t caps[NPAIRS];
    for (int k = 0; k < nr; k++) {
      memset(rb[k], CANARY, cap);
      void* d = rb[k];
      int tag = 9;
      caps[k] = cap;
      if (post_irecv(c, rc[k], 1, &d, &caps[k], &tag, &rmh[k], &ops[np], po, np, NULL, what)) return -1;
      po[np] = &ops[np];
      np++;
    }
    for (int k = 0; k < ns; k++) {
      size_t sz = pair_size(sp[k], r);
      pat_fill(sb[k], sz, seed_of(sp[k], r, 16));
      if (post_isend(c, sc[k], sb[k], sz, 9, smh[k], &ops[np], po, np, NULL, what)) return -1;
      po[np] = &ops[np];
      np++;
    }
    if (wait_ops(c, po, np, what)) return -1;
    for (int k = 0; k < nr; k++) {
      char w2[96];
      snprintf(w2, sizeof w2, "%s pair %d", what, rp[k]);
      if (verify_buf(c, w2, rb[k], cap, pair_size(rp[k], r), seed_of(rp[k], r, 16), ops[k].sizes[0])) return -1;
    }
    for (int k = 0; k < ns; k++)
      if (ops[nr + k].sizes[0] != (int)pair_size(sp[k], r))
        return failf(c, "%s pair %d: send test() reported %d bytes, expected %zu", what, sp[k], ops[nr + k].sizes[0],
                     pair_size(sp[k], r));
  }
  if (sync_ranks(c, "pairs16 done")) return -1;
  for (int k = 0; k < ns; k++)
    if (deregmr(c, sc[k], smh[k], "pairs16") || close_send(c, sc[k], "pairs16")) return -1;
  for (int k = 0; k < nr; k++)
    if (deregmr(c, rc[k], rmh[k], "pairs16") || close_recv(c, rc[k], "pairs16")) return -1;
  for (int k = 0; k < ns; k++) free(sb[k]);
  for (int k = 0; k < nr; k++) free(rb[k]);
  if (std_teardown(c)) return -1;
  detailf(c, "%d comm pairs (8 each way), %d interleaved rounds verified", NPAIRS, rounds);
  return 0;
}

/* ------------------------------------------------------------------------------------ crossed */

/* Two comms from rank 0 to rank 1 on one device, so one endpoint and one connection between the
 * two processes. Each round rank 0 sends five small messages and one of 1 MiB on comm A, then one
 * on comm B; rank 1 receives B's before it posts any receive on A. A provider that stops reading
 * a connection at a message that arrived before its receive (libfabric's native TCP endpoint) never
 * delivers B's unless the plugin takes the waiting messages out itself. */
#define CROSSED_A 6
static size_t crossed_size(int i) { return i == CROSSED_A - 1 ? MIB : 300 + (size_t)i; }

static int scn_crossed(rctx_t* c) {
  if (std_setup(c, 0xc000c)) return -1;
  void *sc[2], *rc[2];
  for (int k = 0; k < 2; k++)
    if (pair_one_way(c, &sc[k], &rc[k], k, 1 + k, k ? "crossed setup B" : "crossed setup A")) return -1;
  const size_t cap = MIB;
  unsigned char* buf[CROSSED_A + 1];
  void* mh[CROSSED_A + 1];
  for (int i = 0; i <= CROSSED_A; i++) {
    void* comm = c->hc.rank == 0 ? sc[i == CROSSED_A] : rc[i == CROSSED_A];
    buf[i] = xalloc(c, cap, "crossed buffer");
    if (!buf[i] || regmr(c, comm, buf[i], cap, &mh[i], "crossed")) return -1;
  }
  const int rounds = 5;
  for (int r = 0; r < rounds; r++) {
    char what[64];
    snprintf(what, sizeof what, "crossed round %d", r);
    op_t ops[CROSSED_A + 1];
    op_t* po[CROSSED_A + 1];
    if (c->hc.rank == 0) {
      for (int i = 0; i <= CROSSED_A; i++) {
        size_t sz = i == CROSSED_A ? 4096 : crossed_size(i);
        pat_fill(buf[i], sz, seed_of(i, r, 12));
        if (post_isend(c, sc[i == CROSSED_A], buf[i], sz, 1, mh[i], &ops[i], po, i, NULL, what)) return -1;
        po[i] = &ops[i];
      }
      if (wait_ops(c, po, CROSSED_A + 1, what)) return -1;
      continue;
    }
    size_t sizes[CROSSED_A + 1];
    for (int i = 0; i <= CROSSED_A; i++) {
      memset(buf[i], CANARY, cap);
      sizes[i] = cap;
    }
    /* B first, alone. */
    void* d = buf[CROSSED_A];
    int tag = 1;
    if (post_irecv(c, rc[1], 1, &d, &sizes[CROSSED_A], &tag, &mh[CROSSED_A], &ops[CROSSED_A], NULL, 0, NULL, what))
      return -1;
    po[0] = &ops[CROSSED_A];
    if (wait_ops(c, po, 1, "crossed: comm B's message, whose receive was posted first")) return -1;
    for (int i = 0; i < CROSSED_A; i++) {
      d = buf[i];
      if (post_irecv(c, rc[0], 1, &d, &sizes[i], &tag, &mh[i], &ops[i], po, i, NULL, what)) return -1;
      po[i] = &ops[i];
    }
    if (wait_ops(c, po, CROSSED_A, what)) return -1;
    for (int i = 0; i <= CROSSED_A; i++) {
      char w2[96];
      snprintf(w2, sizeof w2, "%s message %d", what, i);
      size_t sz = i == CROSSED_A ? 4096 : crossed_size(i);
      if (verify_buf(c, w2, buf[i], cap, sz, seed_of(i, r, 12), ops[i].sizes[0])) return -1;
    }
  }
  if (sync_ranks(c, "crossed done")) return -1;
  for (int i = 0; i <= CROSSED_A; i++) {
    void* comm = c->hc.rank == 0 ? sc[i == CROSSED_A] : rc[i == CROSSED_A];
    if (deregmr(c, comm, mh[i], "crossed")) return -1;
    free(buf[i]);
  }
  for (int k = 0; k < 2; k++)
    if (c->hc.rank == 0 ? close_send(c, sc[k], "crossed") : close_recv(c, rc[k], "crossed")) return -1;
  if (std_teardown(c)) return -1;
  detailf(c, "%d rounds: comm B's message received before any receive on comm A, %d messages ahead of it", rounds,
          CROSSED_A);
  return 0;
}

/* -------------------------------------------------------------------------------------- ring4 */

static void ring_transform(unsigned char* dst, const unsigned char* src, size_t len, int hop, int rank) {
  uint8_t x = (uint8_t)(hop * 31 + rank * 7 + 1);
  for (size_t i = 0; i < len; i++) dst[i] = (uint8_t)((src[i] ^ x) + (uint8_t)(i * 3) + (uint8_t)rank);
}

static int scn_ring4(rctx_t* c) {
  if (std_setup(c, 0xc0007)) return -1;
  const int N = c->hc.nranks, laps = 100;
  const size_t len = 64 * 1024 + 13, cap = len + 64;
  unsigned char myh[HSIZE], nh[1][HSIZE];
  void *lc[1], *sc[1], *rc[1];
  if (do_listen(c, myh, &lc[0])) return -1;
  publish(c, c->hc.rank, 1, myh);
  if (fetch(c, (c->hc.rank + 1) % N, 1, nh[0], "next rank's listen handle")) return -1;
  if (establish(c, 1, nh, sc, 1, lc, rc, "ring4 setup")) return -1;
  unsigned char* sb = xalloc(c, cap, "ring send buffer");
  unsigned char* rb = xalloc(c, cap, "ring recv buffer");
  unsigned char* expect = xalloc(c, cap, "ring expected buffer");
  unsigned char* tmp = xalloc(c, cap, "ring temp buffer");
  if (!sb || !rb || !expect || !tmp) return -1;
  void *smh, *rmh;
  if (regmr(c, sc[0], sb, cap, &smh, "ring4") || regmr(c, rc[0], rb, cap, &rmh, "ring4")) return -1;
  const uint64_t seed0 = seed_of(4, 4, 4);
  if (c->hc.rank == 0) {
    pat_fill(tmp, len, seed0); /* tmp: the buffer rank 0 holds */
    memcpy(expect, tmp, len);
  }
  for (int lap = 0; lap < laps; lap++) {
    char what[64];
    snprintf(what, sizeof what, "ring4 lap %d", lap);
    op_t sop, rop;
    op_t* both[2] = {&sop, &rop};
    void* d = rb;
    size_t rcap = cap;
    int tag = 4;
    memset(rb, CANARY, cap);
    if (post_irecv(c, rc[0], 1, &d, &rcap, &tag, &rmh, &rop, NULL, 0, NULL, what)) return -1;
    if (c->hc.rank == 0) {
      ring_transform(sb, tmp, len, lap * N, 0);
      if (post_isend(c, sc[0], sb, len, 4, smh, &sop, both + 1, 1, NULL, what)) return -1;
      if (wait_ops(c, both, 2, what)) return -1;
      for (int r = 0; r < N; r++) { /* what the lap should have produced */
        ring_transform(tmp, expect, len, lap * N + r, r);
        memcpy(expect, tmp, len);
      }
      if (rop.sizes[0] != (int)len) return failf(c, "%s: received %d bytes, expected %zu", what, rop.sizes[0], len);
      for (size_t i = 0; i < len; i++)
        if (rb[i] != expect[i])
          return failf(c, "%s: byte offset %zu after a full lap is 0x%02x, expected 0x%02x (a hop corrupted data)",
                       what, i, rb[i], expect[i]);
      for (size_t i = len; i < cap; i++)
        if (rb[i] != CANARY) return failf(c, "%s: receive buffer written past the message end at offset %zu", what, i);
      memcpy(tmp, rb, len);
    } else {
      op_t* r1[1] = {&rop};
      if (wait_ops(c, r1, 1, what)) return -1;
      if (rop.sizes[0] != (int)len) return failf(c, "%s: received %d bytes, expected %zu", what, rop.sizes[0], len);
      ring_transform(sb, rb, len, lap * N + c->hc.rank, c->hc.rank);
      if (post_isend(c, sc[0], sb, len, 4, smh, &sop, NULL, 0, NULL, what)) return -1;
      op_t* s1[1] = {&sop};
      if (wait_ops(c, s1, 1, what)) return -1;
    }
    if (sop.sizes[0] != (int)len) return failf(c, "%s: send reported %d bytes, expected %zu", what, sop.sizes[0], len);
  }
  if (sync_ranks(c, "ring4 done")) return -1;
  if (deregmr(c, sc[0], smh, "ring4") || deregmr(c, rc[0], rmh, "ring4")) return -1;
  if (close_send(c, sc[0], "ring4") || close_recv(c, rc[0], "ring4")) return -1;
  free(sb);
  free(rb);
  free(expect);
  free(tmp);
  if (std_teardown(c)) return -1;
  if (c->hc.rank == 0) detailf(c, "%d ranks, %d laps (%d hops) of %zu B, every lap verified", N, laps, laps * N, len);
  return 0;
}

/* ---------------------------------------------------------------------------------- badinput */

#define GARBAGE ((void*)(uintptr_t)0x12345678)

static int scn_badinput(rctx_t* c) {
  if (std_setup(c, 0xc0008)) return -1;
  errs_t e = {{0}, 0};
  int checks = 0;
  net_t* n = &c->net;
  const int v = n->version;
  const int maxr = c->props.maxRecvs;
#define EXPECT_ERR(desc, expr)                                                       \
  do {                                                                               \
    stagef(c, "badinput: %s", desc);                                                 \
    ncclResult_t r_ = (expr);                                                        \
    checks++;                                                                        \
    if (r_ == ncclSuccess) add_err(&e, "%s returned ncclSuccess", desc);             \
    else if (r_ == NET_MISSING_MEMBER) add_err(&e, "%s: table member is NULL", desc); \
  } while (0)

  void *sc, *rc;
  if (pair_loopback(c, &sc, &rc, "badinput setup")) return -1;
  unsigned char hdummy[HSIZE];
  void* lc2 = NULL; /* a live listenComm for type-confusion checks */
  if (do_listen(c, hdummy, &lc2)) return -1;
  const size_t bsz = 4096;
  unsigned char* sb = xalloc(c, bsz, "send buffer");
  unsigned char* rb = xalloc(c, bsz + 64, "recv buffer");
  if (!sb || !rb) return -1;
  void *smh, *rmh;
  if (regmr(c, sc, sb, bsz, &smh, "badinput") || regmr(c, rc, rb, bsz + 64, &rmh, "badinput")) return -1;
  void* tmp = NULL;
  void* req = NULL;
  int done = 0;
  int sizes[NCCL_PROXY_MAX_SUBS];
  void* datav[GMAX + 1];
  size_t szv[GMAX + 1];
  int tagv[GMAX + 1];
  void* mhv[GMAX + 1];
  int isz[GMAX + 1];
  for (int i = 0; i <= GMAX; i++) {
    datav[i] = rb;
    szv[i] = 16;
    tagv[i] = 1;
    mhv[i] = rmh;
    isz[i] = 16;
  }

  /* --- devices / properties / listen --- */
  _Alignas(16) unsigned char pbuf[512];
  EXPECT_ERR("devices(NULL)", net_devices(n, NULL));
  EXPECT_ERR("getProperties(dev = ndev)", net_get_props_raw(n, c->ndev, pbuf));
  EXPECT_ERR("getProperties(dev = -1)", net_get_props_raw(n, -1, pbuf));
  EXPECT_ERR("getProperties(dev 0, NULL props)", net_get_props_raw(n, 0, NULL));
  {
    unsigned char h[HSIZE];
    void* l = NULL;
    EXPECT_ERR("listen(dev = -1)", net_listen(n, -1, h, &l));
    EXPECT_ERR("listen(dev = ndev)", net_listen(n, c->ndev, h, &l));
    EXPECT_ERR("listen(NULL handle)", net_listen(n, 0, NULL, &l));
    EXPECT_ERR("listen(NULL listenComm pointer)", net_listen(n, 0, h, NULL));
  }
  /* --- connect with unusable handles (polled: it may take until FABRICOLL_TIMEOUT_MS) --- */
  {
    unsigned char zero[HSIZE], fill[HSIZE], hlive[HSIZE];
    memset(zero, 0, sizeof zero);
    /* 0x7F everywhere: as an IPv4 address any 4 bytes read 127.127.127.127 (loopback), as a
     * sockaddr family 0x7f7f is invalid; no traffic can leave the host */
    memset(fill, 0x7F, sizeof fill);
    memcpy(hlive, hdummy, HSIZE);
    EXPECT_ERR("connect(dev = -1, live handle)", net_connect(n, -1, hlive, &tmp));
    EXPECT_ERR("connect(NULL handle)", net_connect(n, 0, NULL, &tmp));
    EXPECT_ERR("connect(live handle, NULL sendComm pointer)", net_connect(n, 0, hlive, NULL));
    struct {
      const char* name;
      unsigned char* h;
      void* comm;
      int state; /* 0 pending, 1 error (good), 2 got a comm (bad) */
    } hs[2] = {{"zeroed 128-byte handle", zero, NULL, 0}, {"garbage (0x7F-filled) handle", fill, NULL, 0}};
    int64_t t0 = now_ns(), deadline = t0 + (int64_t)(g_kill_timeout_ms + 5000) * 1000000LL;
    int spins = 0;
    stagef(c, "badinput: polling connect with zeroed and garbage handles");
    for (;;) {
      int pending = 0;
      for (int k = 0; k < 2; k++) {
        if (hs[k].state) continue;
        ncclResult_t r = net_connect(n, 0, hs[k].h, &hs[k].comm);
        if (r != ncclSuccess) hs[k].state = 1;
        else if (hs[k].comm) hs[k].state = 2;
        else pending++;
      }
      if (!pending || now_ns() > deadline) break;
      backoff(&spins);
    }
    for (int k = 0; k < 2; k++) {
      checks++;
      if (hs[k].state == 0)
        add_err(&e, "connect with a %s kept returning ncclSuccess/NULL comm for %.0f ms (expected an error within "
                    "FABRICOLL_TIMEOUT_MS=%d)", hs[k].name, ms_since(t0), g_kill_timeout_ms);
      if (hs[k].state == 2) {
        add_err(&e, "connect with a %s returned a sendComm", hs[k].name);
        net_close_send(n, hs[k].comm);
      }
    }
  }
  /* --- accept --- */
  EXPECT_ERR("accept(NULL listenComm)", net_accept(n, NULL, &tmp));
  EXPECT_ERR("accept(garbage listenComm 0x12345678)", net_accept(n, GARBAGE, &tmp));
  EXPECT_ERR("accept(listenComm, NULL recvComm pointer)", net_accept(n, lc2, NULL));
  EXPECT_ERR("accept(a sendComm as listenComm)", net_accept(n, sc, &tmp));
  /* --- memory registration --- */
  EXPECT_ERR("regMr(NULL comm)", net_regmr(n, NULL, sb, bsz, NCCL_PTR_HOST, &tmp));
  EXPECT_ERR("regMr(garbage comm 0x12345678)", net_regmr(n, GARBAGE, sb, bsz, NCCL_PTR_HOST, &tmp));
  EXPECT_ERR(v <= 7 ? "regMr(size = -1 int)" : "regMr(size = (size_t)1<<50)",
             net_regmr(n, sc, sb, (size_t)1 << 50, NCCL_PTR_HOST, &tmp));
  EXPECT_ERR("regMr(NULL mhandle pointer)", net_regmr(n, sc, sb, bsz, NCCL_PTR_HOST, NULL));
  EXPECT_ERR("regMrDmaBuf(NCCL_PTR_HOST, fd -1) (dma-buf is not supported)",
             net_regmr_dmabuf(n, sc, sb, bsz, NCCL_PTR_HOST, 0, -1, &tmp));
  EXPECT_ERR("regMrDmaBuf(NCCL_PTR_CUDA, fd -1) (dma-buf is not supported)",
             net_regmr_dmabuf(n, rc, rb, bsz, NCCL_PTR_CUDA, 0, -1, &tmp));
  {
    int fd = memfd_create("harness-dmabuf", 0);
    if (fd >= 0 && ftruncate(fd, 4096) == 0)
      EXPECT_ERR("regMrDmaBuf(NCCL_PTR_DMABUF, a memfd) (dma-buf is not supported)",
                 net_regmr_dmabuf(n, sc, sb, bsz, NCCL_PTR_DMABUF, 0, fd, &tmp));
    if (fd >= 0) close(fd);
  }
  EXPECT_ERR("deregMr(NULL comm)", net_deregmr(n, NULL, smh));
  EXPECT_ERR("deregMr(garbage comm 0x12345678)", net_deregmr(n, GARBAGE, smh));
  EXPECT_ERR("deregMr(sendComm, NULL mhandle)", net_deregmr(n, sc, NULL));
  /* --- data path with bad comms (nothing can be posted by these) --- */
  EXPECT_ERR("isend(NULL comm)", net_isend(n, NULL, sb, 16, 1, smh, &req));
  EXPECT_ERR("isend(garbage comm 0x12345678)", net_isend(n, GARBAGE, sb, 16, 1, smh, &req));
  EXPECT_ERR("irecv(NULL comm)", net_irecv(n, NULL, 1, datav, szv, tagv, mhv, &req));
  EXPECT_ERR("irecv(garbage comm 0x12345678)", net_irecv(n, GARBAGE, 1, datav, szv, tagv, mhv, &req));
  EXPECT_ERR("iflush(NULL comm)", net_iflush(n, NULL, 1, datav, isz, mhv, &req));
  EXPECT_ERR("iflush(garbage comm 0x12345678)", net_iflush(n, GARBAGE, 1, datav, isz, mhv, &req));
  EXPECT_ERR("test(NULL request)", net_test(n, NULL, &done, sizes));
  EXPECT_ERR("test(garbage request 0x12345678)", net_test(n, GARBAGE, &done, sizes));
  EXPECT_ERR("closeSend(NULL)", net_close_send(n, NULL));
  EXPECT_ERR("closeRecv(NULL)", net_close_recv(n, NULL));
  EXPECT_ERR("closeListen(NULL)", net_close_listen(n, NULL));
  EXPECT_ERR("closeSend(garbage 0x12345678)", net_close_send(n, GARBAGE));
  EXPECT_ERR("closeRecv(garbage 0x12345678)", net_close_recv(n, GARBAGE));
  EXPECT_ERR("closeListen(garbage 0x12345678)", net_close_listen(n, GARBAGE));

  /* --- the 0x1 hint and a NULL done pointer, on a real transfer that must still work --- */
  {
    const char* what = "badinput: 0x1-hint transfer";
    uint64_t seed = seed_of(8, 8, 1);
    pat_fill(sb, bsz, seed);
    memset(rb, CANARY, bsz + 64);
    op_t rop, sop;
    op_reset(&rop);
    op_reset(&sop);
    void* d = rb;
    size_t cap = bsz + 64;
    int tag = 3;
    int64_t deadline = op_deadline(c);
    int spins = 0, hint_seen = 0;
    stagef(c, "%s: irecv with *request = 0x1", what);
    for (;;) {
      void* r1 = (void*)(uintptr_t)0x1;
      ncclResult_t r = net_irecv(n, rc, 1, &d, &cap, &tag, &rmh, &r1);
      if (r != ncclSuccess) return failf(c, "%s: irecv returned %d (%s)", what, r, rstr(r));
      checks++;
      if (r1 == (void*)(uintptr_t)0x1) {
        hint_seen = 1;
        add_err(&e, "irecv left the 0x1 hint in *request (it must overwrite it)");
        break;
      }
      if (r1) {
        rop.req = r1;
        rop.posted = 1;
        break;
      }
      if (now_ns() > deadline) return failf(c, "%s: irecv kept returning NULL", what);
      backoff(&spins);
    }
    if (!hint_seen) {
      if (post_isend(c, sc, sb, bsz, 3, smh, &sop, NULL, 0, NULL, what)) return -1;
      EXPECT_ERR("test(live send request, NULL done)", net_test(n, sop.req, NULL, sizes));
      op_t* ops[2] = {&sop, &rop};
      if (wait_ops(c, ops, 2, what)) return -1;
      if (sop.sizes[0] != (int)bsz) return failf(c, "%s: send reported %d bytes", what, sop.sizes[0]);
      if (verify_buf(c, what, rb, bsz + 64, bsz, seed, rop.sizes[0])) return -1;
    }
  }

  /* --- bad arguments on live comms; a wrongly accepted one would post a request --- */
  int posted_garbage = 0;
#define EXPECT_ERR_POST(desc, expr)                \
  do {                                             \
    int before_ = e.count;                         \
    EXPECT_ERR(desc, expr);                        \
    if (e.count != before_) posted_garbage = 1;    \
  } while (0)
  EXPECT_ERR_POST(v <= 8 ? "isend(size = -1 int)" : "isend(size = (size_t)1<<50)",
                  net_isend(n, sc, sb, (size_t)1 << 50, 1, smh, &req));
  EXPECT_ERR_POST("isend(NULL request pointer)", net_isend(n, sc, sb, 16, 1, smh, NULL));
  EXPECT_ERR_POST("isend(a recvComm as sendComm)", net_isend(n, rc, sb, 16, 1, smh, &req));
  EXPECT_ERR_POST("isend(a listenComm as sendComm)", net_isend(n, lc2, sb, 16, 1, smh, &req));
  {
    char d1[64], d2[64];
    snprintf(d1, sizeof d1, "irecv(n = maxRecvs+1 = %d)", maxr + 1);
    if (maxr + 1 <= GMAX) EXPECT_ERR_POST(d1, net_irecv(n, rc, maxr + 1, datav, szv, tagv, mhv, &req));
    EXPECT_ERR_POST("irecv(n = 0)", net_irecv(n, rc, 0, datav, szv, tagv, mhv, &req));
    EXPECT_ERR_POST("irecv(n = -1)", net_irecv(n, rc, -1, datav, szv, tagv, mhv, &req));
    size_t huge[1] = {(size_t)1 << 50};
    snprintf(d2, sizeof d2, "%s", v <= 8 ? "irecv(sizes[0] = -1 int)" : "irecv(sizes[0] = (size_t)1<<50)");
    EXPECT_ERR_POST(d2, net_irecv(n, rc, 1, datav, huge, tagv, mhv, &req));
  }
  EXPECT_ERR_POST("irecv(NULL request pointer)", net_irecv(n, rc, 1, datav, szv, tagv, mhv, NULL));
  EXPECT_ERR_POST("irecv(a sendComm as recvComm)", net_irecv(n, sc, 1, datav, szv, tagv, mhv, &req));
  EXPECT_ERR_POST("iflush(NULL request pointer)", net_iflush(n, rc, 1, datav, isz, mhv, NULL));
  {
    int neg[1] = {-5};
    EXPECT_ERR_POST("iflush(sizes[0] = -5)", net_iflush(n, rc, 1, datav, neg, mhv, &req));
  }
  if (maxr + 1 <= GMAX) EXPECT_ERR_POST("iflush(n = maxRecvs+1)", net_iflush(n, rc, maxr + 1, datav, isz, mhv, &req));
  EXPECT_ERR_POST("iflush(a sendComm as recvComm)", net_iflush(n, sc, 1, datav, isz, mhv, &req));

  /* --- the comms still work after all that (skipped if something was wrongly accepted) --- */
  if (!posted_garbage) {
    uint64_t seed = seed_of(8, 8, 2);
    pat_fill(sb, bsz, seed);
    side_t s = {sc, smh, sb, bsz, 0, 0, 5};
    side_t r = {rc, rmh, rb, bsz, bsz + 64, seed, 5};
    if (xfer_step(c, &s, &r, 1, "badinput: transfer after the rejected calls")) return -1;
  }
  /* --- type confusion on close, then real closes, then stale pointers --- */
  int closed_rc = 0, closed_sc = 0;
  {
    int before = e.count;
    EXPECT_ERR("closeSend(a recvComm)", net_close_send(n, rc));
    if (e.count != before) closed_rc = 1;
    before = e.count;
    EXPECT_ERR("closeRecv(a sendComm)", net_close_recv(n, sc));
    if (e.count != before) closed_sc = 1;
    EXPECT_ERR("closeSend(a listenComm)", net_close_send(n, lc2));
  }
  if (deregmr(c, sc, smh, "badinput") || deregmr(c, rc, rmh, "badinput")) return -1;
  EXPECT_ERR("deregMr(already deregistered mhandle)", net_deregmr(n, sc, smh));
  if (!closed_sc && close_send(c, sc, "badinput")) return -1;
  if (!closed_rc && close_recv(c, rc, "badinput")) return -1;
  {
    ncclResult_t r = net_close_listen(n, lc2);
    if (r != ncclSuccess) return failf(c, "badinput: closeListen on an unused listenComm returned %d (%s)", r, rstr(r));
  }
  EXPECT_ERR("closeSend(already closed sendComm)", net_close_send(n, sc));
  EXPECT_ERR("closeRecv(already closed recvComm)", net_close_recv(n, rc));
  EXPECT_ERR("closeListen(already closed listenComm)", net_close_listen(n, lc2));
  EXPECT_ERR("isend(closed sendComm)", net_isend(n, sc, sb, 16, 1, smh, &req));
#undef EXPECT_ERR_POST
#undef EXPECT_ERR
  free(sb);
  free(rb);
  if (std_teardown(c)) return -1;
  if (e.count) return failf(c, "%d of %d checks failed: %s", e.count, checks, e.text);
  detailf(c, "%d bad-input checks rejected without a crash; comms still worked afterwards", checks);
  return 0;
}

/* -------------------------------------------------------------------------------------- kill */

#define KILL_MSG (4 * MIB)
#define KILL_WINDOW 4

static int scn_kill_rank(rctx_t* c) {
  if (std_setup(c, 0xc0009)) return -1;
  void *sc, *rc;
  if (pair_one_way(c, &sc, &rc, 0, 1, "kill setup")) return -1;
  const int sender = c->hc.rank == 0, victim = c->hc.rank == c->hc.board->kill_victim;
  void* comm = sender ? sc : rc;
  unsigned char* buf = xalloc(c, KILL_MSG, "kill buffer");
  void* mh;
  if (!buf || regmr(c, comm, buf, KILL_MSG, &mh, "kill")) return -1;
  pat_fill(buf, KILL_MSG, 1);
  op_t ops[KILL_WINDOW];
  for (int i = 0; i < KILL_WINDOW; i++) op_reset(&ops[i]);
  long long completed = 0, after_kill = 0;
  int64_t start = now_ns();
  int spins = 0;
  const char* how = NULL;
  ncclResult_t err = ncclSuccess;
  stagef(c, "streaming %s (%s)", sender ? "4 MiB isends" : "4 MiB irecvs", victim ? "victim" : "survivor");
  while (!how) {
    int64_t kill_ns = atomic_load(&c->shm->b.kill_ns);
    int64_t now = now_ns();
    if (victim && now - start > 60000000000LL) return failf(c, "victim was never killed");
    if (!victim && !kill_ns && now - start > 60000000000LL) return failf(c, "the parent never killed the peer");
    if (!victim && kill_ns && now > kill_ns + (int64_t)(g_kill_timeout_ms + 5000) * 1000000LL)
      return failf(c, "survivor (%s) got no error from test() within %d ms after the peer was SIGKILLed "
                      "(FABRICOLL_TIMEOUT_MS=%d; %lld messages completed before the kill, %lld after)",
                   sender ? "sender" : "receiver", g_kill_timeout_ms + 5000, g_kill_timeout_ms, completed - after_kill,
                   after_kill);
    if (check_abort(c)) return -1;
    for (int i = 0; i < KILL_WINDOW && !how; i++) {
      op_t* op = &ops[i];
      if (kill_ns && !victim)
        stagef(c, "survivor %s: calling %s on slot %d, %.0f ms after the peer was SIGKILLed", sender ? "sender" : "receiver",
               op->posted ? "test()" : (sender ? "isend()" : "irecv()"), i, (double)(now_ns() - kill_ns) / 1e6);
      else
        copy_str(c->shm->b.stage[c->hc.rank], STAGE_LEN,
                 op->posted ? "streaming: in test()" : (sender ? "streaming: in isend()" : "streaming: in irecv()"));
      if (!op->posted) {
        void* req = NULL;
        void* d = buf;
        size_t cap = KILL_MSG;
        int tag = 11;
        ncclResult_t r = sender ? net_isend(&c->net, sc, buf, KILL_MSG, tag, mh, &req)
                                : net_irecv(&c->net, rc, 1, &d, &cap, &tag, &mh, &req);
        if (r != ncclSuccess) {
          if (victim || !atomic_load(&c->shm->b.kill_ns))
            return failf(c, "%s returned %d (%s) before the peer was killed", sender ? "isend" : "irecv", r, rstr(r));
          how = sender ? "isend" : "irecv";
          err = r;
          break;
        }
        if (req) {
          op_reset(op);
          op->req = req;
          op->posted = 1;
        }
        continue;
      }
      int done = 0;
      ncclResult_t r = net_test(&c->net, op->req, &done, op->sizes);
      if (r != ncclSuccess) {
        if (victim || !atomic_load(&c->shm->b.kill_ns))
          return failf(c, "test() returned %d (%s) before the peer was killed", r, rstr(r));
        how = "test";
        err = r;
        break;
      }
      if (done) {
        if (op->sizes[0] != (int)KILL_MSG && atomic_load(&c->shm->b.kill_ns) == 0)
          return failf(c, "completed message reports %d bytes, expected %zu", op->sizes[0], KILL_MSG);
        op->posted = 0;
        completed++;
        if (atomic_load(&c->shm->b.kill_ns)) after_kill++;
        atomic_store(&c->shm->b.progress[c->hc.rank], completed);
        spins = 0;
      }
    }
    backoff(&spins);
  }
  double ms = (double)(now_ns() - atomic_load(&c->shm->b.kill_ns)) / 1e6;
  atomic_store(&c->shm->val[c->hc.rank][0], (long long)(ms * 1000));
  detailf(c, "%s killed: surviving %s's %s() returned %d (%s) %.0f ms after SIGKILL", sender ? "receiver" : "sender",
          sender ? "sender" : "receiver", how, err, rstr(err), ms);
  /* Tear down like NCCL would after an error: close the comm; it must not hang. */
  stagef(c, "survivor: %s after the peer died", sender ? "closeSend" : "closeRecv");
  int64_t t0 = now_ns();
  ncclResult_t r = sender ? net_close_send(&c->net, sc) : net_close_recv(&c->net, rc);
  double cms = ms_since(t0);
  if (cms > 5000) return failf(c, "closing the comm after the peer died took %.0f ms", cms);
  vlog("[kill] survivor close returned %d after %.1f ms\n", r, cms);
  stagef(c, "survivor: finalize");
  net_finalize(&c->net);
  return 0;
}

/* -------------------------------------------------------------------------------------- cycles */

static int scn_cycles(rctx_t* c) {
  if (std_setup(c, 0xc000a)) return -1;
  const size_t sz = 1024;
  unsigned char* sb = xalloc(c, sz, "cycles buffer");
  unsigned char* rb = xalloc(c, sz + 64, "cycles buffer");
  if (!sb || !rb) return -1;
  int ncyc = g_cycles;
  int mark = ncyc >= 200 ? 100 : (ncyc / 10 > 0 ? ncyc / 10 : 1);
  /* RSS is read after cycle `mark`, after the middle cycle and at the end. A leak grows RSS in
   * both halves; a pool that the provider maps at start and touches all at once later (ofi_rxm
   * on tcp: a one-time step of ~16.6 MiB seen in about 1 run in 4, the same after 4,000 cycles
   * as after 1,000) grows it in one half only. */
  int mid = mark + (ncyc - mark) / 2;
  hc_growth_t g;
  hc_growth_init(&g, mark, mid, ncyc);
  int64_t t0 = now_ns();
  for (int cyc = 0; cyc < ncyc; cyc++) {
    char what[64];
    snprintf(what, sizeof what, "cycle %d", cyc);
    void *sc = NULL, *rc = NULL, *mh = NULL;
    if (pair_one_way(c, &sc, &rc, 0, (unsigned)cyc + 1, what)) return -1;
    uint64_t seed = seed_of(cyc, 10, 10);
    if (c->hc.rank == 0) {
      if (regmr(c, sc, sb, sz, &mh, what)) return -1;
      pat_fill(sb, sz, seed);
      side_t s = {sc, mh, sb, sz, 0, 0, 1};
      if (xfer_step(c, &s, NULL, 0, what)) return -1;
      if (deregmr(c, sc, mh, what)) return -1;
    } else {
      if (regmr(c, rc, rb, sz + 64, &mh, what)) return -1;
      side_t r = {rc, mh, rb, sz, sz + 64, seed, 1};
      if (xfer_step(c, NULL, &r, 0, what)) return -1;
      if (deregmr(c, rc, mh, what)) return -1;
    }
    if (sync_ranks(c, what)) return -1;
    if (c->hc.rank == 0 && close_send(c, sc, what)) return -1;
    if (c->hc.rank == 1 && close_recv(c, rc, what)) return -1;
    hc_growth_sample(&g, cyc + 1);
  }
  double secs = ms_since(t0) / 1000;
  free(sb);
  free(rb);
  if (std_teardown(c)) return -1;
  atomic_store(&c->shm->val[c->hc.rank][0], (long long)(secs * 1000));
  return check_growth(c, &g);
}

/* ------------------------------------------------------------------------------------ versions */

static int scn_versions(rctx_t* c) {
  char err[512], ok[64] = "";
  stagef(c, "dlopen %s", g_lib);
  dlerror();
  void* dl = dlopen(g_lib, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    const char* de = dlerror();
    return failf(c, "dlopen(%s) failed: %s", g_lib, de ? de : "?");
  }
  const size_t size = 64 * 1024;
  unsigned char* sb = xalloc(c, size, "versions send buffer");
  unsigned char* rb = xalloc(c, size + 64, "versions recv buffer");
  if (!sb || !rb) return -1;
  for (int v = NET_MIN_VERSION; v <= NET_MAX_VERSION; v++) {
    char what[64];
    snprintf(what, sizeof what, "v%d", v);
    if (net_bind(&c->net, dl, v, err, sizeof err) != 0) return failf(c, "%s: %s", what, err);
    stagef(c, "%s init", what);
    ncclResult_t r = net_init(&c->net, 0xc000b00ULL + (uint64_t)v);
    if (r != ncclSuccess) return failf(c, "%s init returned %d (%s)", what, r, rstr(r));
    r = net_devices(&c->net, &c->ndev);
    if (r != ncclSuccess || c->ndev < 1) return failf(c, "%s devices returned %d, ndev %d", what, r, c->ndev);
    r = net_get_props(&c->net, 0, &c->props);
    if (r != ncclSuccess) return failf(c, "%s getProperties returned %d (%s)", what, r, rstr(r));
    void *sc, *rc, *smh, *rmh;
    if (pair_both_ways(c, &sc, &rc, 2 * v, 1, what)) return -1;
    if (regmr(c, sc, sb, size, &smh, what) || regmr(c, rc, rb, size + 64, &rmh, what)) return -1;
    uint64_t sseed = seed_of(v, c->hc.rank, 64), rseed = seed_of(v, 1 - c->hc.rank, 64);
    pat_fill(sb, size, sseed);
    side_t s = {sc, smh, sb, size, 0, 0, 20 + c->hc.rank};
    side_t rr = {rc, rmh, rb, size, size + 64, rseed, 20 + (1 - c->hc.rank)};
    if (xfer_step(c, &s, &rr, 0, what)) return -1;
    if (sync_ranks(c, what)) return -1;
    if (deregmr(c, sc, smh, what) || deregmr(c, rc, rmh, what)) return -1;
    if (close_send(c, sc, what) || close_recv(c, rc, what)) return -1;
    stagef(c, "%s finalize", what);
    r = net_finalize(&c->net);
    if (r != ncclSuccess) return failf(c, "%s finalize returned %d (%s)", what, r, rstr(r));
    snprintf(ok + strlen(ok), sizeof ok - strlen(ok), "%sv%d", ok[0] ? "," : "", v);
  }
  free(sb);
  free(rb);
  detailf(c, "%s: connect + 64 KiB each way through each table", ok);
  return 0;
}

/* --------------------------------------------------------------------------------------- reload */

static int scn_reload(rctx_t* c) {
  const int iters = 3;
  const size_t size = 64 * 1024;
  unsigned char* sb = xalloc(c, size, "reload buffer");
  unsigned char* rb = xalloc(c, size + 64, "reload buffer");
  if (!sb || !rb) return -1;
  for (int it = 0; it < iters; it++) {
    char what[64];
    snprintf(what, sizeof what, "reload iteration %d", it);
    if (std_setup(c, 0xc000c + (uint64_t)it)) return -1;
    void *sc, *rc, *smh, *rmh;
    if (pair_loopback(c, &sc, &rc, what)) return -1;
    if (regmr(c, sc, sb, size, &smh, what) || regmr(c, rc, rb, size + 64, &rmh, what)) return -1;
    uint64_t seed = seed_of(it, 12, 12);
    pat_fill(sb, size, seed);
    side_t s = {sc, smh, sb, size, 0, 0, 1};
    side_t r = {rc, rmh, rb, size, size + 64, seed, 1};
    if (xfer_step(c, &s, &r, 0, what)) return -1;
    if (deregmr(c, sc, smh, what) || deregmr(c, rc, rmh, what)) return -1;
    if (close_send(c, sc, what) || close_recv(c, rc, what)) return -1;
    if (std_teardown(c)) return -1;
    stagef(c, "%s: dlclose", what);
    net_dlclose(&c->net);
    struct timespec ts = {0, 50 * 1000 * 1000}; /* let any leftover plugin thread run (and crash, if it would) */
    nanosleep(&ts, NULL);
  }
  free(sb);
  free(rb);
  detailf(c, "%d x (dlopen, init, loopback 64 KiB, close, finalize, dlclose)", iters);
  return 0;
}

/* ============================================================================ parent / runner */

typedef struct {
  const char* name;
  int nranks;
  int (*fn)(rctx_t*);
  int timeout_s;
  int short_timeout_env; /* FABRICOLL_TIMEOUT_MS = g_kill_timeout_ms in the ranks */
  int (*hook)(hc_runstate_t*); /* called by the parent while waiting; -1 = fail (rs->reason) */
} runspec_t;

/* In a forked rank (hc_run_ranks): the scenario with this harness's context around *h. */
static int rank_main(const void* arg, hc_rank_t* h, void* shm) {
  rctx_t c = {.hc = *h, .shm = shm};
  int rc = ((const runspec_t*)arg)->fn(&c);
  *h = c.hc;
  return rc;
}

/* What the shared runner needs to run this scenario. */
static hc_runspec_t hc_spec(const runspec_t* spec) {
  return (hc_runspec_t){spec->name, spec->nranks, (int)(spec->timeout_s * g_time_scale), g_op_timeout_ms,
                        spec->short_timeout_env ? g_kill_timeout_ms : 0, sizeof(struct shm), rank_main, spec,
                        spec->hook, 1};
}

/* Runs one set of ranks; 0 = all good. reason/details are appended to. */
static int run_ranks(const runspec_t* spec, char* reason, size_t rlen, char* details, size_t dlen) {
  hc_runspec_t hs = hc_spec(spec);
  return hc_run_ranks(&hs, reason, rlen, details, dlen, NULL, NULL);
}

typedef struct scenario scenario_t;
struct scenario {
  const char* name;
  const char* help;
  int (*parent)(const scenario_t*, char*, size_t, char*, size_t); /* NULL: run_ranks(&spec) */
  runspec_t spec;
};

static int parent_kill(const scenario_t* s, char* reason, size_t rlen, char* details, size_t dlen) {
  hc_runspec_t hs = hc_spec(&s->spec);
  return hc_run_kill_pair(&hs, reason, rlen, details, dlen, NULL);
}

static int parent_cycles(const scenario_t* s, char* reason, size_t rlen, char* details, size_t dlen) {
  int64_t t0 = now_ns();
  int r = run_ranks(&s->spec, reason, rlen, details, dlen);
  char tmp[DETAIL_LEN];
  snprintf(tmp, sizeof tmp, "%d cycles in %.1f s; %s", g_cycles, ms_since(t0) / 1000, details);
  copy_str(details, dlen, tmp);
  return r;
}

static scenario_t g_scenarios[] = {
    {"symbols", "dlsym v6..v12, init/devices/getProperties (canary), finalize", NULL,
     {"symbols", 1, scn_symbols, 60, 0, NULL}},
    {"connect2", "2 processes: listen / connect / accept polling, closeListen, close", NULL,
     {"connect2", 2, scn_connect2, 60, 0, NULL}},
    {"connect1", "1 thread: connect/accept alternately, NULL devComm, 1 MiB on 2 loopback pairs", NULL,
     {"connect1", 1, scn_connect1, 60, 0, NULL}},
    {"xfer", "sizes 0..64 MiB both ways, recv buffer larger, with and without iflush", NULL,
     {"xfer", 2, scn_xfer, 240, 0, NULL}},
    {"group", "grouped receives n=1..maxRecvs, shuffled tags, posted-order matching", NULL,
     {"group", 2, scn_group, 120, 0, NULL}},
    {"inflight32", "32 isends / 32 irecvs outstanding at once", NULL,
     {"inflight32", 2, scn_inflight32, 120, 0, NULL}},
    {"pairs16", "16 comm pairs between two processes, interleaved traffic", NULL,
     {"pairs16", 2, scn_pairs16, 120, 0, NULL}},
    {"crossed", "2 comms on one connection: the later one's message received first", NULL,
     {"crossed", 2, scn_crossed, 120, 0, NULL}},
    {"ring4", "4 processes in a ring, 100 laps, each hop transforms the buffer", NULL,
     {"ring4", 4, scn_ring4, 180, 0, NULL}},
    {"badinput", "bad arguments return errors without crashing; 0x1 request hint", NULL,
     {"badinput", 1, scn_badinput, 120, 1, NULL}},
    {"kill", "SIGKILL one rank mid-transfer (receiver, then sender): survivor's test() must fail", parent_kill,
     {"kill", 2, scn_kill_rank, 120, 1, hc_kill_pair_hook}},
    {"cycles", "N cycles of listen/connect/accept/regMr/1 KiB/deregMr/close; fd and RSS growth", parent_cycles,
     {"cycles", 2, scn_cycles, 900, 0, NULL}},
    {"multi", "v11+ multi-request groups (NCCL_NET_MULTI_REQUEST) of 1..maxMultiRequestSize each way; misuse", NULL,
     {"multi", 2, scn_multi, 240, 0, NULL}},
    {"versions", "connect + 64 KiB each way through each of v6..v12", NULL,
     {"versions", 2, scn_versions, 180, 0, NULL}},
    {"reload", "dlopen/init/use/finalize/dlclose 3 times (NCCL unloads the plugin with its last comm)", NULL,
     {"reload", 1, scn_reload, 120, 0, NULL}},
};
#define NSCEN ((int)(sizeof g_scenarios / sizeof g_scenarios[0]))

static void usage(FILE* f) {
  fprintf(f,
          "usage: net_harness --lib PATH [--scenario NAME[,NAME...]|all] [--skip NAME[,...]] [--version 6..12]\n"
          "                   [--op-timeout-ms MS] [--kill-timeout-ms MS] [--cycles N] [--time-scale F]\n"
          "                   [--expect-multi N (v11+ maxMultiRequestSize; also runs multi's busy part)] [--list]\n"
          "scenarios:\n");
  for (int i = 0; i < NSCEN; i++) fprintf(f, "  %-11s %s\n", g_scenarios[i].name, g_scenarios[i].help);
}

int main(int argc, char** argv) {
  const char* which = "all";
  const char* skip = NULL;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* val = i + 1 < argc ? argv[i + 1] : NULL;
    int takes = !strcmp(a, "--lib") || !strcmp(a, "--scenario") || !strcmp(a, "--skip") || !strcmp(a, "--version") ||
                !strcmp(a, "--op-timeout-ms") || !strcmp(a, "--kill-timeout-ms") || !strcmp(a, "--cycles") ||
                !strcmp(a, "--time-scale") || !strcmp(a, "--expect-multi");
    if (takes) {
      if (!val) {
        fprintf(stderr, "net_harness: %s needs a value\n", a);
        return 2;
      }
      i++;
    }
    if (!strcmp(a, "--lib")) g_lib = val;
    else if (!strcmp(a, "--scenario")) which = val;
    else if (!strcmp(a, "--skip")) skip = val;
    else if (!strcmp(a, "--version")) g_version = atoi(val);
    else if (!strcmp(a, "--op-timeout-ms")) g_op_timeout_ms = atoi(val);
    else if (!strcmp(a, "--kill-timeout-ms")) g_kill_timeout_ms = atoi(val);
    else if (!strcmp(a, "--cycles")) g_cycles = atoi(val);
    else if (!strcmp(a, "--time-scale")) g_time_scale = atof(val);
    else if (!strcmp(a, "--expect-multi")) g_expect_multi = atoi(val);
    else if (!strcmp(a, "--list") || !strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "net_harness: unknown argument %s\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (!g_lib) {
    fprintf(stderr, "net_harness: --lib PATH is required\n");
    usage(stderr);
    return 2;
  }
  if (g_version < NET_MIN_VERSION || g_version > NET_MAX_VERSION) {
    fprintf(stderr, "net_harness: --version must be 6..12\n");
    return 2;
  }
  if (g_cycles < 1 || g_op_timeout_ms < 100 || g_kill_timeout_ms < 1 || !(g_time_scale > 0)) {
    fprintf(stderr, "net_harness: bad numeric option\n");
    return 2;
  }
  int all = !strcmp(which, "all");
  _Static_assert(offsetof(scenario_t, name) == 0, "unknown_scenario() reads each entry's name first");
  if (!all && unknown_scenario("net_harness", which, g_scenarios, sizeof g_scenarios[0], NSCEN)) {
    usage(stderr);
    return 2;
  }
  warn_missing_lib("net_harness", g_lib);
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  fprintf(stderr, "net_harness: lib %s, table v%d, FABRICOLL_PROVIDER=%s FABRICOLL_DOMAIN=%s\n", g_lib, g_version,
          getenv("FABRICOLL_PROVIDER") ? getenv("FABRICOLL_PROVIDER") : "(unset)",
          getenv("FABRICOLL_DOMAIN") ? getenv("FABRICOLL_DOMAIN") : "(unset)");
  int passed = 0, failed = 0;
  for (int i = 0; i < NSCEN; i++) {
    const scenario_t* s = &g_scenarios[i];
    if (!all && !in_list(which, s->name)) continue;
    if (in_list(skip, s->name)) continue;
    char reason[4 * FAIL_LEN] = "", details[2 * DETAIL_LEN] = "";
    fprintf(stderr, "net_harness: running %s\n", s->name);
    int64_t t0 = now_ns();
    int r = s->parent ? s->parent(s, reason, sizeof reason, details, sizeof details)
                      : run_ranks(&s->spec, reason, sizeof reason, details, sizeof details);
    double secs = ms_since(t0) / 1000;
    if (r == 0) {
      passed++;
      printf("PASS %s (%s%s%.1f s)\n", s->name, details, details[0] ? "; " : "", secs);
    } else {
      failed++;
      for (char* p = reason; *p; p++)
        if (*p == '\n') *p = ' ';
      printf("FAIL %s: %s\n", s->name, reason);
    }
    fflush(stdout);
  }
  printf("net_harness: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
