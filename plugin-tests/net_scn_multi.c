/*
 * net_scn_multi.c: the net_harness scenarios with many requests outstanding on one pair of
 * comms: multi (v11+ multi-request groups, NCCL_NET_MULTI_REQUEST, and their misuse) and
 * inflight32 (32 sends and 32 receives posted at once).
 */
#include "net_harness.h"

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

int scn_multi(rctx_t* c) {
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

int scn_inflight32(rctx_t* c) {
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
