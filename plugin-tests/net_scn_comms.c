/*
 * net_scn_comms.c: the net_harness scenarios with several comms or processes: pairs16 (16 comm
 * pairs between two processes), crossed (two comms on one connection, the later one's message
 * received first) and ring4 (four processes passing a buffer around a ring).
 */
#include "net_harness.h"

/* ----------------------------------------------------------------------------------- pairs16 */

#define NPAIRS 16

static size_t pair_size(int p, int r) {
  if ((p + r) % 7 == 0) return MIB + (size_t)p;
  return 1 + ((size_t)p * 7919 + (size_t)r * 104729) % 300000;
}

int scn_pairs16(rctx_t* c) {
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

int scn_crossed(rctx_t* c) {
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

int scn_ring4(rctx_t* c) {
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
