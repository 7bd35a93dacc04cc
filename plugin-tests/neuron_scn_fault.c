/*
 * neuron_scn_fault.c: the neuron_harness scenarios about misuse and failure: bad arguments
 * (each must return its documented code, never crash), open/close cycles without growth of
 * open fds or RSS, and a peer killed mid-transfer (the survivor gets an error in time).
 */
#include "neuron_harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* -------------------------------------------------------------------------------- badinput */

#define GARBAGE ((void*)(uintptr_t)0x12345678)

/* One process, v6, FABRICOLL_TIMEOUT_MS = --kill-timeout-ms. */
int scn_badinput(rctx_t* c) {
  if (std_setup(c, 6)) return -1;
  nn_t* n = &c->n;
  errs_t e = {{0}, 0};
  void *sc, *rc;
  if (pair_loopback(c, &sc, &rc, "badinput pair")) return -1;
  unsigned char* b = xalloc(c, 4096, "buffer");
  void *mh = NULL, *tmp = NULL, *req = NULL;
  if (!b || regmr(c, sc, b, 4096, &mh, "badinput")) return -1;
  int nd, done = 0, sizes[8];
  unsigned char h[HSIZE] = {0};
  void* data[9] = {b, b, b, b, b, b, b, b, b};
  int szs[9] = {8, 8, 8, 8, 8, 8, 8, 8, 8}, tags[9] = {0};
  void* mhs[9] = {mh, mh, mh, mh, mh, mh, mh, mh, mh};
  /* NULL comms, requests and out-pointers: InvalidArgument, naming the argument. */
  EXPECT_RC(c, &e, "devices(NULL)", nn_devices(n, NULL), ncclInvalidArgument);
  EXPECT_RC(c, &e, "getProperties(0, NULL)", n->t6->getProperties(0, NULL), ncclInvalidArgument);
  EXPECT_RC(c, &e, "listen(0, NULL handle)", nn_listen(n, 0, NULL, &tmp), ncclInvalidArgument);
  EXPECT_RC(c, &e, "listen(0, handle, NULL listenComm)", nn_listen(n, 0, h, NULL), ncclInvalidArgument);
  EXPECT_RC(c, &e, "listen(dev = ndev)", nn_listen(n, c->ndev, h, &tmp), ncclInvalidArgument);
  EXPECT_RC(c, &e, "connect(NULL handle)", nn_connect(n, 0, NULL, &tmp), ncclInvalidArgument);
  EXPECT_RC(c, &e, "accept(NULL listenComm)", nn_accept(n, NULL, &tmp), ncclInvalidArgument);
  EXPECT_RC(c, &e, "regMr(NULL comm)", nn_regmr(n, NULL, b, 64, NCCL_PTR_HOST, &tmp), ncclInvalidArgument);
  EXPECT_RC(c, &e, "regMr(NULL mhandle pointer)", nn_regmr(n, sc, b, 64, NCCL_PTR_HOST, NULL), ncclInvalidArgument);
  EXPECT_RC(c, &e, "deregMr(NULL comm)", nn_deregmr(n, NULL, mh), ncclInvalidArgument);
  EXPECT_RC(c, &e, "isend(NULL comm)", nn_isend(n, NULL, b, 8, 0, mh, &req), ncclInvalidArgument);
  EXPECT_RC(c, &e, "isend(NULL request pointer)", nn_isend(n, sc, b, 8, 0, mh, NULL), ncclInvalidArgument);
  EXPECT_RC(c, &e, "isend(size -1)", nn_isend(n, sc, b, -1, 0, mh, &req), ncclInvalidArgument);
  EXPECT_RC(c, &e, "irecv(NULL comm)", nn_irecv(n, NULL, 1, data, szs, tags, mhs, &req), ncclInvalidArgument);
  EXPECT_RC(c, &e, "iflush(NULL comm)", nn_iflush(n, NULL, 1, data, szs, mhs, &req), ncclInvalidArgument);
  EXPECT_RC(c, &e, "test(NULL request)", nn_test(n, NULL, &done, sizes), ncclInvalidArgument);
  EXPECT_RC(c, &e, "closeSend(NULL)", nn_close_send(n, NULL), ncclInvalidArgument);
  EXPECT_RC(c, &e, "closeRecv(NULL)", nn_close_recv(n, NULL), ncclInvalidArgument);
  EXPECT_RC(c, &e, "closeListen(NULL)", nn_close_listen(n, NULL), ncclInvalidArgument);
  EXPECT_RC(c, &e, "getMrKey(NULL mhandle)", nn_getmrkey(n, NULL, (uint64_t*)(void*)h), ncclInvalidArgument);
  EXPECT_RC(c, &e, "iwrite(NULL comm)", nn_iwrite(n, NULL, b, 8, mh, 0x1000, 1, &req), ncclInvalidArgument);
  EXPECT_RC(c, &e, "iread(NULL comm)", nn_iread(n, NULL, b, 8, mh, 0x1000, 1, &req), ncclInvalidArgument);
  /* irecv n outside 1..8. */
  EXPECT_RC(c, &e, "irecv(n = 0)", nn_irecv(n, rc, 0, data, szs, tags, mhs, &req), ncclInvalidArgument);
  EXPECT_RC(c, &e, "irecv(n = 9)", nn_irecv(n, rc, 9, data, szs, tags, mhs, &req), ncclInvalidArgument);
  EXPECT_RC(c, &e, "irecv(n = -1)", nn_irecv(n, rc, -1, data, szs, tags, mhs, &req), ncclInvalidArgument);
  /* Registration types: HOST only. */
  EXPECT_RC(c, &e, "regMr(type CUDA 2)", nn_regmr(n, sc, b, 64, NCCL_PTR_CUDA, &tmp), ncclInvalidArgument);
  EXPECT_RC(c, &e, "regMr(type NEURON 4)", nn_regmr(n, sc, b, 64, NCCL_PTR_NEURON, &tmp), ncclInvalidUsage);
  EXPECT_RC(c, &e, "regMr(type 99)", nn_regmr(n, sc, b, 64, 99, &tmp), ncclInvalidArgument);
  EXPECT_RC(c, &e, "regMr(type 0)", nn_regmr(n, sc, b, 64, 0, &tmp), ncclInvalidArgument);
  EXPECT_RC(c, &e, "regMrDmaBuf(NEURON, fd -1)", nn_regmr_dmabuf(n, sc, b, 64, NCCL_PTR_NEURON, 0, -1, &tmp),
            ncclInvalidUsage);
  EXPECT_RC(c, &e, "regMrDmaBuf(HOST, fd 0)", nn_regmr_dmabuf(n, sc, b, 64, NCCL_PTR_HOST, 0, 0, &tmp),
            ncclInvalidUsage);
  void* dmh = NULL;
  EXPECT_RC(c, &e, "regMrDmaBuf(HOST, fd -1) = regMr", nn_regmr_dmabuf(n, sc, b, 64, NCCL_PTR_HOST, 0, -1, &dmh),
            ncclSuccess);
  if (dmh) EXPECT_RC(c, &e, "deregMr of the regMrDmaBuf handle", nn_deregmr(n, sc, dmh), ncclSuccess);
  /* A garbage or zeroed handle: connect fails within FABRICOLL_TIMEOUT_MS (+5 s), never gives a comm. */
  unsigned char* hz = calloc(1, HSIZE);
  unsigned char* hg = malloc(HSIZE);
  if (!hz || !hg) return failf(c, "out of memory");
  memset(hg, 0x7F, HSIZE);
  struct {
    const char* name;
    unsigned char* h;
    void* comm;
    int state; /* 0 pending, 1 error (good), 2 got a comm (bad) */
    ncclResult_t r;
  } hs[2] = {{"zeroed handle", hz, NULL, 0, 0}, {"garbage (0x7F-filled) handle", hg, NULL, 0, 0}};
  int64_t t0 = now_ns(), deadline = t0 + (int64_t)(g_kill_timeout_ms + 5000) * 1000000LL;
  int spins = 0;
  stagef(c, "badinput: polling connect with zeroed and garbage handles");
  for (;;) {
    int pending = 0;
    for (int k = 0; k < 2; k++) {
      if (hs[k].state) continue;
      hs[k].r = nn_connect(n, 0, hs[k].h, &hs[k].comm);
      if (hs[k].r != ncclSuccess) hs[k].state = 1;
      else if (hs[k].comm) hs[k].state = 2;
      else pending++;
    }
    if (!pending || now_ns() > deadline) break;
    backoff(&spins);
  }
  for (int k = 0; k < 2; k++) {
    c->hc.checks++;
    if (hs[k].state == 0)
      add_err(&e, "connect with a %s kept returning Success/NULL comm for %.0f ms (FABRICOLL_TIMEOUT_MS=%d)", hs[k].name,
              ms_since(t0), g_kill_timeout_ms);
    if (hs[k].state == 2) add_err(&e, "connect with a %s returned a sendComm", hs[k].name);
    if (hs[k].state == 1 && hs[k].r != ncclInvalidArgument && hs[k].r != ncclRemoteError)
      add_err(&e, "connect with a %s returned %d (%s), expected InvalidArgument or RemoteError", hs[k].name, hs[k].r,
              rstr(hs[k].r));
  }
  free(hz);
  free(hg);
  /* The pair still works after all of that. */
  unsigned char* rb = xalloc(c, 4096 + 64, "recv");
  void* rmh;
  if (!rb || regmr(c, rc, rb, 4096 + 64, &rmh, "badinput")) return -1;
  if (xfer(c, sc, mh, b, rc, rmh, rb, 4096 + 64, 4096, 0xBAD, "4 KiB after the bad calls")) return -1;
  if (deregmr(c, sc, mh, "badinput") || deregmr(c, rc, rmh, "badinput")) return -1;
  if (nn_close_send(n, sc) || nn_close_recv(n, rc)) return failf(c, "badinput: close failed");
  free(b);
  free(rb);
  (void)nd;
  detailf(c, "%lld bad calls", c->hc.checks);
  if (std_teardown(c)) return -1;
  return errs_finish(c, &e, "badinput");
}

/* -------------------------------------------------------------------------------- v4block */

/* v4's blocking calls end at FABRICOLL_TIMEOUT_MS (= --kill-timeout-ms here) with RemoteError:
 * accept with nobody connecting, and connect to a zeroed handle (an error, at once or then). */
int scn_v4block(rctx_t* c) {
  if (std_setup(c, 4)) return -1;
  errs_t e = {{0}, 0};
  /* twice the deadline plus slack: bounded, and still true on a loaded machine */
  const double limit = 2.0 * g_kill_timeout_ms + 5000;
  unsigned char h[NCCL_NET_HANDLE_MAXSIZE_V4] = {0};
  void *lc = NULL, *rc = NULL, *sc = NULL;
  ncclResult_t r = nn_listen(&c->n, 0, h, &lc);
  if (r != ncclSuccess || !lc) return failf(c, "v4 listen returned %d (%s)", r, rstr(r));
  stagef(c, "v4 accept with nobody connecting (FABRICOLL_TIMEOUT_MS=%d)", g_kill_timeout_ms);
  int64_t t0 = now_ns();
  EXPECT_RC(c, &e, "v4 accept with nobody connecting", nn_accept(&c->n, lc, &rc), ncclRemoteError);
  double ms = ms_since(t0);
  c->hc.checks += 2;
  if (rc) add_err(&e, "v4 accept with nobody connecting gave a recvComm");
  if (ms > limit) add_err(&e, "v4 accept blocked %.0f ms, FABRICOLL_TIMEOUT_MS is %d", ms, g_kill_timeout_ms);
  nn_close_listen(&c->n, lc);
  unsigned char* zero = calloc(1, NCCL_NET_HANDLE_MAXSIZE_V4); /* exactly 64 bytes, for ASan */
  if (!zero) return failf(c, "out of memory");
  stagef(c, "v4 connect to a zeroed handle");
  t0 = now_ns();
  r = nn_connect(&c->n, 0, zero, &sc);
  double cms = ms_since(t0);
  free(zero);
  c->hc.checks += 2;
  if (r == ncclSuccess) add_err(&e, "v4 connect to a zeroed handle returned Success (sendComm %p)", sc);
  if (cms > limit) add_err(&e, "v4 connect to a zeroed handle blocked %.0f ms", cms);
  detailf(c, "v4 accept gave up after %.0f ms, connect to a zeroed handle returned %d (%s) after %.0f ms", ms, r,
          rstr(r), cms);
  if (std_teardown(c)) return -1;
  return errs_finish(c, &e, "v4block");
}

/* ---------------------------------------------------------------------------------- cycles */

/* g_cycles times: rank 1 listens, rank 0 connects, 1 KiB, close. fds and RSS are read after
 * cycle `mark` (the pools are warm), after the middle one and at the end. */
int scn_cycles(rctx_t* c) {
  if (std_setup(c, 6)) return -1;
  const size_t sz = 1024;
  unsigned char* buf = xalloc(c, sz + 64, "cycles buffer");
  if (!buf) return -1;
  const int ncyc = g_cycles, mark = ncyc / 10, mid = mark + (ncyc - mark) / 2;
  hc_growth_t g;
  hc_growth_init(&g, mark, mid, ncyc);
  for (int cyc = 0; cyc < ncyc; cyc++) {
    char what[64];
    snprintf(what, sizeof what, "cycle %d", cyc);
    void *sc = NULL, *rc = NULL, *mh = NULL;
    if (pair_one_way(c, 0, 1, &sc, &rc, cyc % NSLOT, (unsigned)(cyc / NSLOT) + 1, what)) return -1;
    void* comm = c->hc.rank == 0 ? sc : rc;
    if (regmr(c, comm, buf, sz + 64, &mh, what)) return -1;
    uint64_t seed = seed_of(cyc, 10, 10);
    if (c->hc.rank == 0 ? xfer(c, sc, mh, buf, NULL, NULL, NULL, 0, sz, seed, what)
                     : xfer(c, NULL, NULL, NULL, rc, mh, buf, sz + 64, sz, seed, what))
      return -1;
    if (deregmr(c, comm, mh, what) || sync_ranks(c, what)) return -1;
    ncclResult_t r = c->hc.rank == 0 ? nn_close_send(&c->n, sc) : nn_close_recv(&c->n, rc);
    if (r != ncclSuccess) return failf(c, "%s: close returned %d (%s)", what, r, rstr(r));
    hc_growth_sample(&g, cyc + 1);
  }
  free(buf);
  if (std_teardown(c)) return -1;
  c->hc.checks += 3;
  return check_growth(c, &g);
}

/* ------------------------------------------------------------------------------------ kill */

#define KILL_MSG (4 * MIB)
#define KILL_WINDOW 4

/* Rank 0 streams 4 MiB isends to rank 1; the parent SIGKILLs board.kill_victim after both have done
 * 3; the survivor must get an error from isend/irecv/test within FABRICOLL_TIMEOUT_MS + 5 s. */
int scn_kill(rctx_t* c) {
  if (std_setup(c, 6)) return -1;
  void *sc, *rc;
  if (pair_one_way(c, 0, 1, &sc, &rc, 0, 1, "kill setup")) return -1;
  const int sender = c->hc.rank == 0, victim = c->hc.rank == c->hc.board->kill_victim;
  void* comm = sender ? sc : rc;
  unsigned char* buf = xalloc(c, KILL_MSG, "kill buffer");
  void* mh;
  if (!buf || regmr(c, comm, buf, KILL_MSG, &mh, "kill")) return -1;
  pat_fill(buf, KILL_MSG, 1);
  void* req[KILL_WINDOW] = {0};
  long long completed = 0;
  int64_t start = now_ns();
  int spins = 0;
  const char* how = NULL;
  ncclResult_t err = ncclSuccess;
  stagef(c, "streaming 4 MiB %s (%s)", sender ? "isends" : "irecvs", victim ? "victim" : "survivor");
  while (!how) {
    int64_t kill_ns = atomic_load(&c->shm->b.kill_ns), now = now_ns();
    if (now - start > 60000000000LL) return failf(c, victim ? "victim was never killed" : "the peer was never killed");
    if (!victim && kill_ns && now > kill_ns + (int64_t)(g_kill_timeout_ms + 5000) * 1000000LL)
      return failf(c, "survivor (%s) got no error within %d ms after the peer was SIGKILLed (FABRICOLL_TIMEOUT_MS=%d)",
                   sender ? "sender" : "receiver", g_kill_timeout_ms + 5000, g_kill_timeout_ms);
    if (check_abort(c)) return -1;
    for (int i = 0; i < KILL_WINDOW && !how; i++) {
      ncclResult_t r;
      if (!req[i]) {
        r = sender ? nn_isend(&c->n, sc, buf, KILL_MSG, 11, mh, &req[i]) : nn_irecv1(&c->n, rc, buf, KILL_MSG, 11, mh,
                                                                                       &req[i]);
        if (r != ncclSuccess) {
          if (victim || !atomic_load(&c->shm->b.kill_ns))
            return failf(c, "%s returned %d (%s) before the peer was killed", sender ? "isend" : "irecv", r, rstr(r));
          how = sender ? "isend" : "irecv", err = r;
        }
        continue;
      }
      int done = 0, sizes[1] = {0};
      r = nn_test(&c->n, req[i], &done, sizes);
      if (r != ncclSuccess) {
        if (victim || !atomic_load(&c->shm->b.kill_ns))
          return failf(c, "test returned %d (%s) before the peer was killed", r, rstr(r));
        how = "test", err = r;
      } else if (done) {
        req[i] = NULL;
        atomic_store(&c->shm->b.progress[c->hc.rank], ++completed);
        spins = 0;
      }
    }
    backoff(&spins);
  }
  double ms = (double)(now_ns() - atomic_load(&c->shm->b.kill_ns)) / 1e6;
  c->hc.checks++;
  detailf(c, "%s killed: the %s's %s returned %d (%s) %.0f ms after SIGKILL", sender ? "receiver" : "sender",
          sender ? "sender" : "receiver", how, err, rstr(err), ms);
  /* Tear down like libnccom after an error: close and fini must not hang. */
  stagef(c, "survivor: close after the peer died");
  int64_t t0 = now_ns();
  (void)(sender ? nn_close_send(&c->n, sc) : nn_close_recv(&c->n, rc));
  if (ms_since(t0) > 5000) return failf(c, "closing the comm after the peer died took %.0f ms", ms_since(t0));
  return std_teardown(c);
}
