/*
 * neuron_scn_setup.c: the neuron_harness scenarios about loading and connecting: symbols and
 * layouts, properties, the v6 init/fini lifecycle, connection setup polled from one thread
 * (v5/v6), a 4-rank mesh, and the blocking v4 connect/accept.
 */
#include "neuron_harness.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --------------------------------------------------------------------------------- symbols */

/* Every slot of a table, as the raw pointers that follow `name`. */
static void check_slots(rctx_t* c, errs_t* e, const char* sym, const void* table, size_t size) {
  const void* const* p = table;
  size_t n = size / sizeof(void*);
  c->hc.checks++;
  if (p[0] == NULL) add_err(e, "%s: name is NULL", sym);
  else if (strcmp((const char*)p[0], "fabricoll") != 0) add_err(e, "%s: name is '%s', expected 'fabricoll'", sym,
                                                                  (const char*)p[0]);
  for (size_t i = 1; i < n; i++) {
    c->hc.checks++;
    if (p[i] == NULL) add_err(e, "%s: the slot at offset %zu is NULL", sym, i * sizeof(void*));
  }
}

int scn_symbols(rctx_t* c) {
  errs_t e = {{0}, 0};
  dlerror();
  void* dl = dlopen(g_lib, RTLD_NOW | RTLD_LOCAL);
  if (!dl) return failf(c, "dlopen(%s) failed: %s", g_lib, dlerror());
  static const struct {
    const char* sym;
    size_t size;
  } tables[] = {{"ncclNetPlugin_v4", sizeof(ncclNet_v4_t)},
                {"ncclNetPlugin_v5", sizeof(ncclNet_v5_t)},
                {"ncclNetPlugin_v6", sizeof(ncclNet_v6_t)}};
  for (int i = 0; i < 3; i++) {
    c->hc.checks++;
    void* t = dlsym(dl, tables[i].sym);
    if (!t) add_err(&e, "dlsym(%s) failed", tables[i].sym);
    else check_slots(c, &e, tables[i].sym, t, tables[i].size);
  }
  /* The NVIDIA tables must not be in the Neuron build: libnccom would not look for them, but a
   * build mix-up would show here first. */
  static const char* nvidia[] = {"ncclNetPlugin_v7",      "ncclNetPlugin_v8",      "ncclNetPlugin_v9",
                                 "ncclNetPlugin_v10",     "ncclNetPlugin_v11",     "ncclNetPlugin_v12",
                                 "ncclCollNetPlugin_v6",  "ncclCollNetPlugin_v7",  "ncclCollNetPlugin_v8",
                                 "ncclCollNetPlugin_v9",  "ncclCollNetPlugin_v10", "ncclCollNetPlugin_v11",
                                 "ncclCollNetPlugin_v12", "ncclNetPlugin_v3",      "ncclNetPlugin_v2"};
  for (size_t i = 0; i < sizeof nvidia / sizeof nvidia[0]; i++) {
    c->hc.checks++;
    if (dlsym(dl, nvidia[i]) != NULL) add_err(&e, "dlsym(%s) succeeded: the Neuron build must not export it", nvidia[i]);
  }
  dlclose(dl);
  detailf(c, "3 tables, NVIDIA-only symbols absent");
  return errs_finish(c, &e, "symbols");
}

/* ----------------------------------------------------------------------------------- props */

#define PCANARY 0x5A

/* getProperties into a buffer with a canary after the struct; returns the decoded props. */
static void props_one(rctx_t* c, errs_t* e, int dev, ncclNetProperties_v6_t* p) {
  const size_t psz = c->n.v == 4 ? sizeof(ncclNetProperties_v4_t) : sizeof(ncclNetProperties_v6_t);
  unsigned char buf[sizeof(ncclNetProperties_v6_t) + 64];
  memset(buf, PCANARY, sizeof buf);
  ncclResult_t r = c->n.v == 4 ? c->n.t4->getProperties(dev, (ncclNetProperties_v4_t*)(void*)buf)
                   : c->n.v == 5 ? c->n.t5->getProperties(dev, (ncclNetProperties_v6_t*)(void*)buf)
                                 : c->n.t6->getProperties(dev, (ncclNetProperties_v6_t*)(void*)buf);
  EXPECT_RC(c, e, "getProperties", r, ncclSuccess);
  for (size_t i = psz; i < sizeof buf; i++) {
    c->hc.checks++;
    if (buf[i] != PCANARY) {
      add_err(e, "v%d getProperties(%d) wrote byte %zu, past the %zu-byte struct", c->n.v, dev, i, psz);
      break;
    }
  }
  memset(p, 0, sizeof *p);
  if (c->n.v == 4) {
    ncclNetProperties_v4_t p4;
    memcpy(&p4, buf, sizeof p4);
    p->name = p4.name, p->pciPath = p4.pciPath, p->guid = p4.guid, p->ptrSupport = p4.ptrSupport;
    p->speed = p4.speed, p->port = p4.port, p->maxComms = p4.maxComms;
  } else {
    memcpy(p, buf, sizeof *p);
  }
}

#define PCHECK(cond, ...)        \
  do {                           \
    c->hc.checks++;                 \
    if (!(cond)) add_err(&e, __VA_ARGS__); \
  } while (0)

/* Rank 0 checks v6, rank 1 v5, rank 2 v4: each process inits one table (v4/v5 have no fini). */
int scn_props(rctx_t* c) {
  const int v = 6 - c->hc.rank;
  if (std_setup(c, v)) return -1;
  errs_t e = {{0}, 0};
  char summary[DETAIL_LEN] = "";
  for (int dev = 0; dev < c->ndev; dev++) {
    ncclNetProperties_v6_t p;
    props_one(c, &e, dev, &p);
    PCHECK(p.name != NULL, "v%d dev %d: name is NULL", v, dev);
    PCHECK(p.ptrSupport & NCCL_PTR_HOST, "v%d dev %d: ptrSupport 0x%x lacks HOST", v, dev, p.ptrSupport);
    PCHECK(!(p.ptrSupport & NCCL_PTR_CUDA), "v%d dev %d: ptrSupport 0x%x has CUDA", v, dev, p.ptrSupport);
    PCHECK(!(p.ptrSupport & NCCL_PTR_NEURON), "v%d dev %d: ptrSupport 0x%x has NEURON (no Neuron device here)", v,
           dev, p.ptrSupport);
    PCHECK(p.speed > 0, "v%d dev %d: speed %d", v, dev, p.speed);
    PCHECK(p.port == 1, "v%d dev %d: port %d, expected 1", v, dev, p.port);
    PCHECK(p.maxComms == 65536, "v%d dev %d: maxComms %d, expected 65536", v, dev, p.maxComms);
    if (v != 4) {
      PCHECK(p.regIsGlobal == 0, "v%d dev %d: regIsGlobal %d, expected 0", v, dev, p.regIsGlobal);
      PCHECK(p.latency > 0 && isfinite(p.latency), "v%d dev %d: latency %g", v, dev, (double)p.latency);
      PCHECK(p.maxRecvs == 1, "v%d dev %d: maxRecvs %d, expected 1", v, dev, p.maxRecvs);
      PCHECK(p.rma_supported == 0 || p.rma_supported == 1, "v%d dev %d: rma_supported %d", v, dev, p.rma_supported);
      if (g_expect_rma >= 0)
        PCHECK(p.rma_supported == g_expect_rma, "v%d dev %d: rma_supported %d, expected %d (--expect-rma: %s)", v, dev,
               p.rma_supported, g_expect_rma,
               g_expect_rma ? "fi_info lists FI_RMA with FI_MR_VIRT_ADDR" : "fi_info lists no FI_RMA");
      PCHECK(p.max_mr_key_size <= 8, "v%d dev %d: max_mr_key_size %zu > 8 (keys are uint64_t)", v, dev,
             p.max_mr_key_size);
      if (p.rma_supported == 1) {
        PCHECK(p.max_write_inline_size > 0, "v%d dev %d: rma_supported 1 but max_write_inline_size 0", v, dev);
        PCHECK(p.max_mr_key_size >= 1, "v%d dev %d: rma_supported 1 but max_mr_key_size 0", v, dev);
      } else {
        PCHECK(p.max_write_inline_size == 0, "v%d dev %d: rma_supported 0 but max_write_inline_size %zu", v, dev,
               p.max_write_inline_size);
      }
    }
    if (dev == 0)
      snprintf(summary, sizeof summary, "v%d: %d dev, '%s' ptr 0x%x %d Mbps lat %g us rma %d inline %zu key %zu", v,
               c->ndev, p.name ? p.name : "(null)", p.ptrSupport, p.speed, (double)p.latency, p.rma_supported,
               p.max_write_inline_size, p.max_mr_key_size);
  }
  ncclNetProperties_v6_t p;
  EXPECT_RC(c, &e, "getProperties(dev = ndev)", nn_props(&c->n, c->ndev, &p), ncclInvalidArgument);
  EXPECT_RC(c, &e, "getProperties(dev = -1)", nn_props(&c->n, -1, &p), ncclInvalidArgument);
  detailf(c, "%s", summary);
  if (std_teardown(c)) return -1;
  return errs_finish(c, &e, "props");
}

/* ------------------------------------------------------------------------------- lifecycle */

static int one_mib_both_ways(rctx_t* c, unsigned seq, const char* what) {
  void *sc0, *rc0, *sc1, *rc1;
  if (pair_one_way(c, 0, 1, &sc0, &rc1, 0, seq, what)) return -1;
  if (pair_one_way(c, 1, 0, &sc1, &rc0, 1, seq, what)) return -1;
  void* sc = c->hc.rank == 0 ? sc0 : sc1;
  void* rc = c->hc.rank == 0 ? rc0 : rc1;
  const size_t sz = MIB, cap = MIB + 64;
  unsigned char* sb = xalloc(c, sz, "send buffer");
  unsigned char* rb = xalloc(c, cap, "recv buffer");
  void *smh, *rmh;
  if (!sb || !rb || regmr(c, sc, sb, sz, &smh, what) || regmr(c, rc, rb, cap, &rmh, what)) return -1;
  uint64_t mine = seed_of(seq, c->hc.rank, 1), theirs = seed_of(seq, 1 - c->hc.rank, 1);
  if (c->hc.rank == 0) {
    if (xfer(c, sc, smh, sb, NULL, NULL, NULL, 0, sz, mine, what)) return -1;
    if (xfer(c, NULL, NULL, NULL, rc, rmh, rb, cap, sz, theirs, what)) return -1;
  } else {
    if (xfer(c, NULL, NULL, NULL, rc, rmh, rb, cap, sz, theirs, what)) return -1;
    if (xfer(c, sc, smh, sb, NULL, NULL, NULL, 0, sz, mine, what)) return -1;
  }
  if (deregmr(c, sc, smh, what) || deregmr(c, rc, rmh, what)) return -1;
  if (sync_ranks(c, what)) return -1;
  if (nn_close_send(&c->n, sc) != ncclSuccess || nn_close_recv(&c->n, rc) != ncclSuccess)
    return failf(c, "%s: closeSend/closeRecv failed", what);
  free(sb);
  free(rb);
  return 0;
}

int scn_lifecycle(rctx_t* c) {
  errs_t e = {{0}, 0};
  char err[512];
  if (nn_open(&c->n, g_lib, 6, err, sizeof err)) return failf(c, "%s", err);
  nn_t* n = &c->n;
  int nd = 0;
  void* tmp = NULL;
  unsigned char h[HSIZE] = {0};
  ncclNetProperties_v6_t p;
  /* Before init: InvalidUsage. */
  EXPECT_RC(c, &e, "devices before init", nn_devices(n, &nd), ncclInvalidUsage);
  EXPECT_RC(c, &e, "getProperties before init", nn_props(n, 0, &p), ncclInvalidUsage);
  EXPECT_RC(c, &e, "listen before init", nn_listen(n, 0, h, &tmp), ncclInvalidUsage);
  EXPECT_RC(c, &e, "fini before init", nn_fini(n), ncclSystemError);
  EXPECT_RC(c, &e, "init", nn_init(n), ncclSuccess);
  EXPECT_RC(c, &e, "second init without fini", nn_init(n), ncclSystemError);
  if (e.count) return errs_finish(c, &e, "lifecycle (first init)");
  if (one_mib_both_ways(c, 1, "first init: 1 MiB each way")) return -1;
  /* Leave a listen comm, a connected pair, a registration and a posted receive open: fini must
   * close them all, and closing them afterwards must be quiet. */
  void *sc0, *rc0, *sc1, *rc1, *lc = NULL;
  if (pair_one_way(c, 0, 1, &sc0, &rc1, 0, 2, "objects left open")) return -1;
  if (pair_one_way(c, 1, 0, &sc1, &rc0, 1, 2, "objects left open")) return -1;
  void* sc = c->hc.rank == 0 ? sc0 : sc1;
  void* rc = c->hc.rank == 0 ? rc0 : rc1;
  EXPECT_RC(c, &e, "listen (left open for fini)", nn_listen(n, 0, h, &lc), ncclSuccess);
  unsigned char* buf = xalloc(c, 4096, "buffer");
  void *mh = NULL, *req = NULL;
  if (!buf || regmr(c, rc, buf, 4096, &mh, "left open")) return -1;
  if (post_recv(c, rc, buf, 4096, 3, mh, &req, "left open")) return -1;
  if (sync_ranks(c, "before fini")) return -1;
  EXPECT_RC(c, &e, "fini with open comms, listen comm, registration, request", nn_fini(n), ncclSuccess);
  EXPECT_RC(c, &e, "second fini", nn_fini(n), ncclSystemError);
  /* Using what fini closed, other than closing it: InvalidUsage. */
  int done = 0, sizes[1];
  void* req2 = NULL;
  EXPECT_RC(c, &e, "isend after fini", nn_isend(n, sc, buf, 8, 3, mh, &req2), ncclInvalidUsage);
  EXPECT_RC(c, &e, "test after fini", nn_test(n, req, &done, sizes), ncclInvalidUsage);
  EXPECT_RC(c, &e, "accept after fini", nn_accept(n, lc, &tmp), ncclInvalidUsage);
  EXPECT_RC(c, &e, "regMr after fini", nn_regmr(n, rc, buf, 64, NCCL_PTR_HOST, &tmp), ncclInvalidUsage);
  long warns1 = atomic_load(&log_warns);
  EXPECT_RC(c, &e, "deregMr after fini", nn_deregmr(n, rc, mh), ncclSuccess);
  EXPECT_RC(c, &e, "closeSend after fini", nn_close_send(n, sc), ncclSuccess);
  EXPECT_RC(c, &e, "closeRecv after fini", nn_close_recv(n, rc), ncclSuccess);
  EXPECT_RC(c, &e, "closeListen after fini", nn_close_listen(n, lc), ncclSuccess);
  c->hc.checks++;
  if (atomic_load(&log_warns) != warns1)
    add_err(&e, "closing after fini logged %ld WARN line(s), last: %s", atomic_load(&log_warns) - warns1,
            log_last_warn);
  EXPECT_RC(c, &e, "devices after fini", nn_devices(n, &nd), ncclInvalidUsage);
  EXPECT_RC(c, &e, "listen after fini", nn_listen(n, 0, h, &tmp), ncclInvalidUsage);
  free(buf);
  if (sync_ranks(c, "after fini")) return -1;
  /* Re-init in the same process: everything works again. */
  EXPECT_RC(c, &e, "init after fini", nn_init(n), ncclSuccess);
  if (e.count) return errs_finish(c, &e, "lifecycle");
  if (nn_devices(n, &nd) != ncclSuccess || nd < 1) return failf(c, "devices after re-init failed (%d)", nd);
  if (one_mib_both_ways(c, 3, "after re-init: 1 MiB each way")) return -1;
  EXPECT_RC(c, &e, "fini", nn_fini(n), ncclSuccess);
  c->hc.checks += 2;
  if (atomic_load(&log_no_net))
    add_err(&e, "%ld of %ld logger calls lacked the NET flag (0x10)", atomic_load(&log_no_net), atomic_load(&log_calls));
  if (atomic_load(&log_bad)) add_err(&e, "%ld logger calls had a NULL format or a bad level", atomic_load(&log_bad));
  nn_close_dl(n);
  detailf(c, "init/fini/re-init, %ld logger calls (%ld WARN)", atomic_load(&log_calls), atomic_load(&log_warns));
  return errs_finish(c, &e, "lifecycle");
}

/* -------------------------------------------------------------------------------- connect1 */

/* Rank 0 with v6, rank 1 with v5: a loopback pair in one thread, then 1 MiB through it. */
int scn_connect1(rctx_t* c) {
  if (std_setup(c, 6 - c->hc.rank)) return -1;
  /* The handle buffer must stay within 128 bytes: canaries around it. */
  unsigned char hb[HSIZE + 64];
  memset(hb, 0xC3, sizeof hb);
  void* lc = NULL;
  ncclResult_t r = nn_listen(&c->n, 0, hb + 32, &lc);
  if (r != ncclSuccess || !lc) return failf(c, "listen returned %d (%s)", r, rstr(r));
  c->hc.checks += 2;
  for (int i = 0; i < 32; i++)
    if (hb[i] != 0xC3 || hb[32 + HSIZE + i] != 0xC3) return failf(c, "listen wrote outside the 128-byte handle");
  nn_close_listen(&c->n, lc);
  void *sc, *rc;
  if (pair_loopback(c, &sc, &rc, "loopback pair")) return -1;
  const size_t sz = MIB + 3, cap = MIB + 128;
  unsigned char* sb = xalloc(c, sz, "send");
  unsigned char* rb = xalloc(c, cap, "recv");
  void *smh, *rmh;
  if (!sb || !rb || regmr(c, sc, sb, sz, &smh, "loopback") || regmr(c, rc, rb, cap, &rmh, "loopback")) return -1;
  if (xfer(c, sc, smh, sb, rc, rmh, rb, cap, sz, seed_of(c->hc.rank, 2, 3), "loopback 1 MiB")) return -1;
  if (deregmr(c, sc, smh, "loopback") || deregmr(c, rc, rmh, "loopback")) return -1;
  if (nn_close_send(&c->n, sc) || nn_close_recv(&c->n, rc)) return failf(c, "close of the loopback pair failed");
  free(sb);
  free(rb);
  detailf(c, "v6 and v5 connect in one thread");
  return std_teardown(c);
}

/* ----------------------------------------------------------------------------------- mesh4 */

#define MESH_MSG (256 * 1024)

int scn_mesh4(rctx_t* c) {
  if (std_setup(c, 6)) return -1;
  const int R = c->hc.nranks, me = c->hc.rank;
  unsigned char handle[HSIZE] = {0};
  void* lc = NULL;
  ncclResult_t r = nn_listen(&c->n, 0, handle, &lc);
  if (r != ncclSuccess || !lc) return failf(c, "listen returned %d (%s)", r, rstr(r));
  publish(c, 0, 1, handle);
  unsigned char* hs[MAXR] = {0};
  void* sc[MAXR] = {0};
  void* rc[MAXR] = {0};
  for (int p = 0; p < R; p++) {
    if (p == me) continue;
    hs[p] = malloc(HSIZE); /* one buffer per connection, kept for the repeated connect calls */
    if (!hs[p] || fetch(c, p, 0, 1, hs[p], "peer handle")) return hs[p] ? -1 : failf(c, "out of memory");
  }
  /* One thread: connect to every peer and accept every peer, alternately, until all are up. */
  int accepted = 0, connected = 0;
  int64_t deadline = op_deadline(c);
  int spins = 0;
  stagef(c, "mesh: connecting and accepting in one thread");
  while (accepted < R - 1 || connected < R - 1) {
    for (int p = 0; p < R; p++) {
      if (p == me || sc[p]) continue;
      if ((r = nn_connect(&c->n, 0, hs[p], &sc[p])) != ncclSuccess)
        return failf(c, "connect to rank %d returned %d (%s)", p, r, rstr(r));
      if (sc[p]) connected++;
    }
    if (accepted < R - 1) {
      void* a = NULL;
      if ((r = nn_accept(&c->n, lc, &a)) != ncclSuccess) return failf(c, "accept returned %d (%s)", r, rstr(r));
      if (a) rc[accepted++] = a; /* the peer is known from its first message */
    }
    if (check_abort(c)) return -1;
    if (now_ns() > deadline)
      return failf(c, "mesh not up within %d ms: %d/%d connected, %d/%d accepted", g_op_timeout_ms, connected, R - 1,
                   accepted, R - 1);
    backoff(&spins);
  }
  if (nn_close_listen(&c->n, lc) != ncclSuccess) return failf(c, "closeListen failed");
  /* Each rank sends MESH_MSG to every peer: 8 bytes of its rank, then the pattern of (src, dst). */
  unsigned char* sb[MAXR] = {0};
  unsigned char* rb[MAXR] = {0};
  void *smh[MAXR] = {0}, *rmh[MAXR] = {0}, *sreq[MAXR] = {0}, *rreq[MAXR] = {0};
  for (int i = 0; i < R - 1; i++) {
    rb[i] = xalloc(c, MESH_MSG + 64, "mesh recv");
    if (!rb[i] || regmr(c, rc[i], rb[i], MESH_MSG + 64, &rmh[i], "mesh") ||
        post_recv(c, rc[i], rb[i], MESH_MSG + 64, 5, rmh[i], &rreq[i], "mesh"))
      return -1;
  }
  for (int p = 0; p < R; p++) {
    if (p == me) continue;
    sb[p] = xalloc(c, MESH_MSG, "mesh send");
    if (!sb[p]) return -1;
    uint64_t hdr = (uint64_t)me;
    pat_fill(sb[p], MESH_MSG, seed_of(me, p, 4));
    memcpy(sb[p], &hdr, 8);
    if (regmr(c, sc[p], sb[p], MESH_MSG, &smh[p], "mesh") ||
        post_send(c, sc[p], sb[p], MESH_MSG, 5, smh[p], &sreq[p], "mesh"))
      return -1;
  }
  /* Test every outstanding request in turn, as libnccom's proxy does: waiting on one alone could
   * stall a peer that needs this rank to drain another connection. */
  int seen = 0, left = 2 * (R - 1);
  spins = 0;
  int64_t deadline2 = op_deadline(c);
  while (left) {
    for (int p = 0; p < R; p++) {
      int done = 0, sizes[1] = {-1};
      if (p != me && sreq[p]) {
        if ((r = nn_test(&c->n, sreq[p], &done, sizes)) != ncclSuccess)
          return failf(c, "mesh: test(send to rank %d) returned %d (%s)", p, r, rstr(r));
        if (done) sreq[p] = NULL, left--;
      }
      if (p >= R - 1 || !rreq[p]) continue;
      done = 0;
      if ((r = nn_test(&c->n, rreq[p], &done, sizes)) != ncclSuccess)
        return failf(c, "mesh: test(receive %d) returned %d (%s)", p, r, rstr(r));
      if (!done) continue;
      rreq[p] = NULL, left--;
      uint64_t src;
      memcpy(&src, rb[p], 8);
      c->hc.checks += 3;
      if (sizes[0] != MESH_MSG) return failf(c, "mesh: received %d bytes, expected %d", sizes[0], MESH_MSG);
      if (src >= (uint64_t)R || src == (uint64_t)me || (seen & (1 << src)))
        return failf(c, "mesh: message %d names sender %llu", p, (unsigned long long)src);
      seen |= 1 << src;
      size_t nbad;
      long first = pat_check_at(rb[p] + 8, MESH_MSG - 8, seed_of(src, me, 4), 8, &nbad);
      if (first >= 0)
        return failf(c, "mesh: from rank %llu: %zu bytes differ, first at %ld", (unsigned long long)src, nbad,
                     first + 8);
    }
    if (check_abort(c)) return -1;
    if (now_ns() > deadline2) return failf(c, "mesh: %d of %d requests not done within %d ms", left, 2 * (R - 1),
                                           g_op_timeout_ms);
    backoff(&spins);
  }
  if (sync_ranks(c, "mesh done")) return -1;
  for (int p = 0; p < R; p++) {
    if (p == me) continue;
    if (deregmr(c, sc[p], smh[p], "mesh")) return -1;
    nn_close_send(&c->n, sc[p]);
    free(sb[p]);
    free(hs[p]);
  }
  for (int i = 0; i < R - 1; i++) {
    if (deregmr(c, rc[i], rmh[i], "mesh")) return -1;
    nn_close_recv(&c->n, rc[i]);
    free(rb[i]);
  }
  detailf(c, "%d ranks, full mesh from one thread each", R);
  return std_teardown(c);
}

/* -------------------------------------------------------------------------------- connect4 */

/* v4: rank 1 listens (64 handle bytes: the rest of a 128-byte buffer stays untouched), rank 0
 * connects with a 64-byte heap handle; both calls block until the comm exists. */
int scn_connect4(rctx_t* c) {
  if (std_setup(c, 4)) return -1;
  if (c->hc.rank == 1) {
    unsigned char h[HSIZE];
    memset(h, 0xC3, sizeof h);
    void* lc = NULL;
    ncclResult_t r = nn_listen(&c->n, 0, h, &lc);
    if (r != ncclSuccess || !lc) return failf(c, "v4 listen returned %d (%s)", r, rstr(r));
    c->hc.checks++;
    for (int i = NCCL_NET_HANDLE_MAXSIZE_V4; i < HSIZE; i++)
      if (h[i] != 0xC3) return failf(c, "v4 listen wrote handle byte %d (v4 handles are 64 bytes)", i);
    nn_close_listen(&c->n, lc);
  }
  void *sc, *rc;
  int64_t t0 = now_ns();
  if (pair_one_way(c, 0, 1, &sc, &rc, 0, 1, "v4 blocking connect/accept")) return -1;
  c->hc.checks++;
  const size_t sz = 100000;
  unsigned char* b = xalloc(c, sz + 64, "v4 buffer");
  void* mh;
  void* comm = c->hc.rank == 0 ? sc : rc;
  if (!b || regmr(c, comm, b, sz + 64, &mh, "v4")) return -1;
  if (c->hc.rank == 0 ? xfer(c, sc, mh, b, NULL, NULL, NULL, 0, sz, 99, "v4 100000 B")
                   : xfer(c, NULL, NULL, NULL, rc, mh, b, sz + 64, sz, 99, "v4 100000 B"))
    return -1;
  if (deregmr(c, comm, mh, "v4")) return -1;
  if (sync_ranks(c, "v4 done")) return -1;
  if ((c->hc.rank == 0 ? nn_close_send(&c->n, sc) : nn_close_recv(&c->n, rc)) != ncclSuccess)
    return failf(c, "v4 close failed");
  free(b);
  detailf(c, "v4 connect+accept blocked %.0f ms", ms_since(t0));
  return std_teardown(c);
}
