/*
 * net_util.c: the helpers of net_harness's scenarios (see net_harness.h): the handle mailbox,
 * plugin setup and teardown, connection setup polled as NCCL's proxy does (listen, connect,
 * accept), posting and waiting for requests with deadlines, checked transfers, and the small
 * wrappers of regMr/deregMr/close that turn an error code into the rank's failure.
 */
#include "net_harness.h"

/* ------------------------------------------------------------------- handles, flags, barriers */

void publish(rctx_t* c, int slot, unsigned seq, const void* handle) {
  memcpy(c->shm->slot[slot].data, handle, HSIZE);
  atomic_store_explicit(&c->shm->slot[slot].seq, seq, memory_order_release);
}

int fetch(rctx_t* c, int slot, unsigned seq, void* out, const char* what) {
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

int std_setup(rctx_t* c, uint64_t commId) {
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

int std_teardown(rctx_t* c) {
  stagef(c, "finalize");
  ncclResult_t r = net_finalize(&c->net);
  if (r != ncclSuccess) return failf(c, "finalize returned %d (%s)", r, rstr(r));
  return 0;
}

int do_listen(rctx_t* c, unsigned char handle[HSIZE], void** lc) {
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
int establish(rctx_t* c, int nconn, unsigned char (*handles)[HSIZE], void** scs, int nacc, void** lcs,
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


void op_reset(op_t* op) {
  memset(op, 0, sizeof *op);
  memset(op->sizes, 0xFF, sizeof op->sizes); /* -1: "not written" */
}

/* Test one op if it is posted and not yet done. */
int poll_op(rctx_t* c, op_t* op, const char* what) {
  if (!op->posted || op->done) return 0;
  int done = 0;
  ncclResult_t r = net_test(&c->net, op->req, &done, op->is_flush ? NULL : op->sizes);
  if (r != ncclSuccess) return failf(c, "%s: test() returned %d (%s)", what, r, rstr(r));
  if (done) op->done = 1;
  return 0;
}

int wait_ops(rctx_t* c, op_t** ops, int n, const char* what) {
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
int post_isend(rctx_t* c, void* sc, void* data, size_t size, int tag, void* mh, op_t* op, op_t** others,
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

int post_irecv(rctx_t* c, void* rc, int n, void** data, size_t* sizes, int* tags, void** mhs, op_t* op,
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

int flush_nulls, flush_reqs; /* iflush statistics for details */

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
int verify_buf(rctx_t* c, const char* what, const unsigned char* buf, size_t cap, size_t expect, uint64_t seed,
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

int check_sizes_tail(rctx_t* c, const char* what, const op_t* op, int n) {
  for (int i = n; i < NCCL_PROXY_MAX_SUBS; i++)
    if (op->sizes[i] != -1)
      return failf(c, "%s: test() wrote sizes[%d]=%d although the receive had n=%d buffers", what, i, op->sizes[i], n);
  return 0;
}

/* One message out on s (if any) and one in on r (if any), both verified. The caller fills the send
 * buffer; the receive buffer is set to the canary here. */
int xfer_step(rctx_t* c, const side_t* s, const side_t* r, int flush, const char* what) {
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

int regmr(rctx_t* c, void* comm, void* buf, size_t size, void** mh, const char* what) {
  *mh = NULL;
  stagef(c, "%s: regMr(%zu B)", what, size);
  ncclResult_t r = net_regmr(&c->net, comm, buf, size, NCCL_PTR_HOST, mh);
  if (r != ncclSuccess) return failf(c, "%s: regMr(%zu B, NCCL_PTR_HOST) returned %d (%s)", what, size, r, rstr(r));
  return 0;
}

int deregmr(rctx_t* c, void* comm, void* mh, const char* what) {
  stagef(c, "%s: deregMr", what);
  ncclResult_t r = net_deregmr(&c->net, comm, mh);
  if (r != ncclSuccess) return failf(c, "%s: deregMr returned %d (%s)", what, r, rstr(r));
  return 0;
}

int close_send(rctx_t* c, void* sc, const char* what) {
  stagef(c, "%s: closeSend", what);
  ncclResult_t r = net_close_send(&c->net, sc);
  if (r != ncclSuccess) return failf(c, "%s: closeSend returned %d (%s)", what, r, rstr(r));
  return 0;
}

int close_recv(rctx_t* c, void* rc, const char* what) {
  stagef(c, "%s: closeRecv", what);
  ncclResult_t r = net_close_recv(&c->net, rc);
  if (r != ncclSuccess) return failf(c, "%s: closeRecv returned %d (%s)", what, r, rstr(r));
  return 0;
}

/* Both ranks of a 2-rank scenario get one sendComm to the peer and one recvComm from it. */
int pair_both_ways(rctx_t* c, void** sc, void** rc, int slot_base, unsigned seq, const char* what) {
  unsigned char mine[HSIZE], peer[1][HSIZE];
  void* lc[1];
  if (do_listen(c, mine, &lc[0])) return -1;
  publish(c, slot_base + c->hc.rank, seq, mine);
  if (fetch(c, slot_base + (1 - c->hc.rank), seq, peer[0], "peer's listen handle")) return -1;
  return establish(c, 1, peer, sc, 1, lc, rc, what);
}

/* One direction: rank 1 listens and receives, rank 0 connects and sends. */
int pair_one_way(rctx_t* c, void** sc, void** rc, int slot, unsigned seq, const char* what) {
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
int pair_loopback(rctx_t* c, void** sc, void** rc, const char* what) {
  unsigned char h[1][HSIZE];
  void* lc[1];
  if (do_listen(c, h[0], &lc[0])) return -1;
  return establish(c, 1, h, sc, 1, lc, rc, what);
}
