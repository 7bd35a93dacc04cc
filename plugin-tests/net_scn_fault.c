/*
 * net_scn_fault.c: the net_harness scenarios about misuse and failure: badinput (bad arguments
 * return errors without a crash) and kill (a rank SIGKILLed mid-transfer: the survivor's test()
 * must fail within the plugin's timeout).
 */
#include "net_harness.h"

/* ---------------------------------------------------------------------------------- badinput */

#define GARBAGE ((void*)(uintptr_t)0x12345678)

int scn_badinput(rctx_t* c) {
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
  /* regMrDmaBuf of a host buffer, or without an fd, is regMr (as NCCL's own transports do) */
  {
    void *dmh = NULL;
    checks++;
    if (net_regmr_dmabuf(n, sc, sb, bsz, NCCL_PTR_HOST, 0, -1, &dmh) != ncclSuccess || !dmh)
      add_err(&e, "regMrDmaBuf(NCCL_PTR_HOST, fd -1) failed: it is regMr");
    else if (net_deregmr(n, sc, dmh) != ncclSuccess)
      add_err(&e, "deregMr of regMrDmaBuf(NCCL_PTR_HOST, fd -1) failed");
  }
  EXPECT_ERR("regMrDmaBuf(NCCL_PTR_CUDA of host memory, fd -1)",
             net_regmr_dmabuf(n, rc, rb, bsz, NCCL_PTR_CUDA, 0, -1, &tmp));
  {
    int fd = memfd_create("harness-dmabuf", 0);
    if (fd >= 0 && ftruncate(fd, 4096) == 0)
      EXPECT_ERR("regMrDmaBuf(type NCCL_PTR_DMABUF 4, a memfd) (not a buffer type)",
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

int scn_kill_rank(rctx_t* c) {
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
