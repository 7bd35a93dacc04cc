/*
 * neuron_scn_ring.c: the neuron_harness scenarios on a ring of 4 ranks, each connected to its
 * next and its previous rank in both directions (two send and two receive comms on one device,
 * so two peers per endpoint), as libnccom's ring algorithms connect them:
 *  - ring6, ring5: each round every rank iwrites into its next rank and ireads from its previous
 *    one (where the provider offers RMA), then sends a small message on the backward ring (to its
 *    previous rank), then a small "written" message on the forward ring, after which it checks
 *    what its previous rank wrote and what it read. Every wait tests all of the rank's
 *    outstanding requests in turn, as libnccom's proxy does, so a rank keeps serving its peers'
 *    operations while it waits for its own.
 *  - ringcycles: N cycles of connecting both rings, registering fresh buffers, moving 256 KiB
 *    each way, deregistering, closing and freeing; open fds and RSS after a warm-up, in the
 *    middle and at the end (a per-cycle leak grows RSS in both halves).
 */
#include "neuron_harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RING_ROUNDS 40
#define RING_MSG 16 /* the small messages: round and sender, then nothing */
#define RING_RCAP 64 /* their receive buffers */
/* The region the previous rank writes into (and the one the next rank reads): the previous rank
 * may already write round r + 1 while this one checks round r (it waits for nothing of ours
 * before its next iwrite), so even and odd rounds write into halves of their own. */
#define RING_HALF (2 * MIB)
#define RING_TSZ (2 * RING_HALF)

/* Sizes of the round's iwrite and iread, cycled. */
static const size_t ring_rma[] = {8, 4093, 65541, MIB + 3};
#define NRING_RMA ((int)(sizeof ring_rma / sizeof ring_rma[0]))

typedef struct {
  uint64_t taddr, tkey; /* where the previous rank writes */
  uint64_t saddr, skey; /* what the next rank reads */
} ring_keys_t;

/* Test every request of reqs[0..n) in turn until all are done; sizes[i] gets each one's size. */
static int ring_wait(rctx_t* c, void** reqs, int* sizes, int n, const char* const* names, int round) {
  int64_t deadline = op_deadline(c);
  int spins = 0, left = 0;
  for (int i = 0; i < n; i++) left += reqs[i] != NULL;
  while (left) {
    for (int i = 0; i < n; i++) {
      if (!reqs[i]) continue;
      int done = 0, sz[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
      ncclResult_t r = nn_test(&c->n, reqs[i], &done, sz);
      if (r != ncclSuccess) return failf(c, "round %d: test(%s) returned %d (%s)", round, names[i], r, rstr(r));
      if (!done) continue;
      reqs[i] = NULL;
      sizes[i] = sz[0];
      left--;
    }
    if (check_abort(c)) return -1;
    if (now_ns() > deadline) {
      char pending[256] = "";
      for (int i = 0; i < n; i++)
        if (reqs[i]) append(pending, sizeof pending, "%s%s", pending[0] ? ", " : "", names[i]);
      return failf(c, "round %d: not done within %d ms: %s", round, g_op_timeout_ms, pending);
    }
    backoff(&spins);
  }
  return 0;
}

/* Post an RMA operation, calling again while the request comes back NULL (busy). */
static int ring_post_rma(rctx_t* c, int write, void* comm, void* buf, size_t size, void* mh, uint64_t addr,
                         uint64_t key, void** req, int round) {
  int64_t deadline = op_deadline(c);
  int spins = 0;
  *req = NULL;
  for (;;) {
    ncclResult_t r = write ? nn_iwrite(&c->n, comm, buf, size, mh, addr, key, req)
                           : nn_iread(&c->n, comm, buf, size, mh, addr, key, req);
    if (r != ncclSuccess)
      return failf(c, "round %d: %s(%zu B) returned %d (%s)", round, write ? "iwrite" : "iread", size, r, rstr(r));
    if (*req) return 0;
    if (check_abort(c)) return -1;
    if (now_ns() > deadline)
      return failf(c, "round %d: %s(%zu B) kept returning a NULL request", round, write ? "iwrite" : "iread", size);
    backoff(&spins);
  }
}

/* Checks a small ring message: 8 bytes of round, 8 of sender, from sender `from`. */
static int ring_check_msg(rctx_t* c, const unsigned char* b, int got, int round, int from, const char* ring) {
  uint64_t hdr[2];
  memcpy(hdr, b, sizeof hdr);
  c->hc.checks += 2;
  if (got != RING_MSG) return failf(c, "round %d: the %s message reports %d bytes, expected %d", round, ring, got, RING_MSG);
  if (hdr[0] != (uint64_t)round || hdr[1] != (uint64_t)from)
    return failf(c, "round %d: the %s message carries round %llu from rank %llu, expected round %d from rank %d",
                 round, ring, (unsigned long long)hdr[0], (unsigned long long)hdr[1], round, from);
  return 0;
}

/* Receives a small message on rc (from rank `from`) and sends one on sc, both with tag `tag`,
 * both waited for; checks the one received. */
static int ring_message(rctx_t* c, void* rc, void* rmh, unsigned char* rbuf, void* sc, void* smh, unsigned char* sbuf,
                        int tag, int round, int from, const char* const* names, const char* ring) {
  void* reqs[2];
  int sizes[2] = {-1, -1};
  uint64_t hdr[2] = {(uint64_t)round, (uint64_t)c->hc.rank};
  memcpy(sbuf, hdr, sizeof hdr);
  memset(rbuf, 0xA5, RING_RCAP);
  if (post_recv(c, rc, rbuf, RING_RCAP, tag, rmh, &reqs[0], ring) ||
      post_send(c, sc, sbuf, RING_MSG, tag, smh, &reqs[1], ring) || ring_wait(c, reqs, sizes, 2, names, round))
    return -1;
  return ring_check_msg(c, rbuf, sizes[0], round, from, ring);
}

/* Every rank listens twice (slot 0: its previous rank connects forward; slot 1: its next rank
 * connects backward) and connects to both neighbours, connecting and accepting alternately in one
 * thread until all four comms are up. */
static int ring_connect(rctx_t* c, unsigned seq, void** sc_fwd, void** sc_bwd, void** rc_fwd, void** rc_bwd) {
  const int R = c->hc.nranks, me = c->hc.rank, next = (me + 1) % R, prev = (me + R - 1) % R;
  unsigned char* hf = calloc(1, HSIZE);
  unsigned char* hb = calloc(1, HSIZE);
  unsigned char* to_next = malloc(HSIZE);
  unsigned char* to_prev = malloc(HSIZE);
  void *lf = NULL, *lb = NULL;
  int rc = -1;
  if (!hf || !hb || !to_next || !to_prev) {
    failf(c, "out of memory");
    goto out;
  }
  ncclResult_t r;
  if ((r = nn_listen(&c->n, 0, hf, &lf)) != ncclSuccess || !lf || (r = nn_listen(&c->n, 0, hb, &lb)) != ncclSuccess ||
      !lb) {
    failf(c, "listen returned %d (%s)", r, rstr(r));
    goto out;
  }
  *sc_fwd = *sc_bwd = *rc_fwd = *rc_bwd = NULL;
  publish(c, 0, seq, hf);
  publish(c, 1, seq, hb);
  if (fetch(c, next, 0, seq, to_next, "next rank's forward handle") ||
      fetch(c, prev, 1, seq, to_prev, "previous rank's backward handle"))
    goto out;
  int64_t deadline = op_deadline(c);
  int spins = 0;
  stagef(c, "ring: connecting and accepting both neighbours in one thread");
  while (!*sc_fwd || !*sc_bwd || !*rc_fwd || !*rc_bwd) {
    if (!*sc_fwd && (r = nn_connect(&c->n, 0, to_next, sc_fwd)) != ncclSuccess) {
      failf(c, "connect to the next rank returned %d (%s)", r, rstr(r));
      goto out;
    }
    if (!*sc_bwd && (r = nn_connect(&c->n, 0, to_prev, sc_bwd)) != ncclSuccess) {
      failf(c, "connect to the previous rank returned %d (%s)", r, rstr(r));
      goto out;
    }
    if (!*rc_fwd && (r = nn_accept(&c->n, lf, rc_fwd)) != ncclSuccess) {
      failf(c, "accept from the previous rank returned %d (%s)", r, rstr(r));
      goto out;
    }
    if (!*rc_bwd && (r = nn_accept(&c->n, lb, rc_bwd)) != ncclSuccess) {
      failf(c, "accept from the next rank returned %d (%s)", r, rstr(r));
      goto out;
    }
    if (check_abort(c)) goto out;
    if (now_ns() > deadline) {
      failf(c, "ring not up within %d ms (to next %p, to previous %p, from previous %p, from next %p)",
            g_op_timeout_ms, *sc_fwd, *sc_bwd, *rc_fwd, *rc_bwd);
      goto out;
    }
    backoff(&spins);
  }
  if (nn_close_listen(&c->n, lf) != ncclSuccess || nn_close_listen(&c->n, lb) != ncclSuccess) {
    failf(c, "closeListen failed");
    goto out;
  }
  rc = 0;
out:
  free(hf);
  free(hb);
  free(to_next);
  free(to_prev);
  return rc;
}

static int ring_version(rctx_t* c, int v) {
  if (std_setup(c, v)) return -1;
  if (c->hc.nranks < 3) return failf(c, "the ring scenario needs 3 or more ranks, not %d", c->hc.nranks);
  const int R = c->hc.nranks, me = c->hc.rank, next = (me + 1) % R, prev = (me + R - 1) % R;
  void *sc_fwd = NULL, *sc_bwd = NULL, *rc_fwd = NULL, *rc_bwd = NULL;
  if (ring_connect(c, 1, &sc_fwd, &sc_bwd, &rc_fwd, &rc_bwd)) return -1;
  const int rma = c->props.rma_supported == 1;
  /* t: the previous rank writes here; s: the next rank reads here; src, dst: my iwrite's source
   * and my iread's destination; mf/mb/rf/rb: the small messages (forward and backward). */
  unsigned char* t = xalloc(c, RING_TSZ, "ring target");
  unsigned char* s = xalloc(c, RING_TSZ, "ring read source");
  unsigned char* src = xalloc(c, RING_TSZ, "ring write source");
  unsigned char* dst = xalloc(c, RING_TSZ, "ring read destination");
  unsigned char* msg = xalloc(c, 4 * RING_RCAP, "ring messages");
  if (!t || !s || !src || !dst || !msg) return -1;
  unsigned char *mf = msg, *mb = msg + RING_RCAP, *rf = msg + 2 * RING_RCAP, *rb = msg + 3 * RING_RCAP;
  void *tmh, *smh, *srcmh, *dstmh, *mfmh, *mbmh, *rfmh, *rbmh;
  if (regmr(c, rc_fwd, t, RING_TSZ, &tmh, "ring target") || regmr(c, sc_bwd, s, RING_TSZ, &smh, "ring read source") ||
      regmr(c, sc_fwd, src, RING_TSZ, &srcmh, "ring write source") ||
      regmr(c, rc_fwd, dst, RING_TSZ, &dstmh, "ring read destination") ||
      regmr(c, sc_fwd, mf, RING_MSG, &mfmh, "ring forward message") ||
      regmr(c, sc_bwd, mb, RING_MSG, &mbmh, "ring backward message") ||
      regmr(c, rc_fwd, rf, RING_RCAP, &rfmh, "ring forward receive") ||
      regmr(c, rc_bwd, rb, RING_RCAP, &rbmh, "ring backward receive"))
    return -1;
  pat_fill(s, RING_TSZ, seed_of(me, 41, 0));
  ring_keys_t mine = {(uintptr_t)t, 0, (uintptr_t)s, 0}, of_next, of_prev;
  if (rma) {
    ncclResult_t r;
    if ((r = nn_getmrkey(&c->n, tmh, &mine.tkey)) != ncclSuccess || (r = nn_getmrkey(&c->n, smh, &mine.skey)) != ncclSuccess)
      return failf(c, "getMrKey returned %d (%s)", r, rstr(r));
    c->hc.checks += 2;
  }
  unsigned char box[HSIZE] = {0};
  memcpy(box, &mine, sizeof mine);
  publish(c, 2, 1, box);
  if (fetch(c, next, 2, 1, box, "next rank's target address and key")) return -1;
  memcpy(&of_next, box, sizeof of_next);
  if (fetch(c, prev, 2, 1, box, "previous rank's source address and key")) return -1;
  memcpy(&of_prev, box, sizeof of_prev);

  static const char* const rma_names[2] = {"iwrite to the next rank", "iread from the previous rank"};
  static const char* const bwd_names[2] = {"receive from the next rank (backward ring)",
                                           "send to the previous rank (backward ring)"};
  static const char* const fwd_names[2] = {"receive from the previous rank (forward ring)",
                                           "send to the next rank (forward ring)"};
  for (int round = 0; round < RING_ROUNDS; round++) {
    void* reqs[2];
    int sizes[2] = {-1, -1};
    const size_t n = ring_rma[round % NRING_RMA];
    /* Each round writes and reads at another offset, so a stale round's data cannot pass. */
    const size_t off = (size_t)(round % 2) * RING_HALF + ((size_t)round * 4099) % (RING_HALF - n);
    stagef(c, "ring v%d round %d: iwrite %zu B to rank %d, iread from rank %d", v, round, n, next, prev);
    if (rma) {
      pat_fill_at(src, n, seed_of(me, 42, round), off);
      memset(dst, 0, n);
      if (ring_post_rma(c, 1, sc_fwd, src, n, srcmh, of_next.taddr + off, of_next.tkey, &reqs[0], round) ||
          ring_post_rma(c, 0, rc_fwd, dst, n, dstmh, of_prev.saddr + off, of_prev.skey, &reqs[1], round) ||
          ring_wait(c, reqs, sizes, 2, rma_names, round))
        return -1;
      c->hc.checks += 3;
      if (sizes[0] != (int)n || sizes[1] != (int)n)
        return failf(c, "round %d: iwrite and iread of %zu B report %d and %d bytes", round, n, sizes[0], sizes[1]);
      size_t nbad;
      long first = pat_check_at(dst, n, seed_of(prev, 41, 0), off, &nbad);
      if (first >= 0)
        return failf(c, "round %d: iread of %zu B from rank %d: %zu bytes differ, first at %ld", round, n, prev, nbad,
                     first);
    }
    /* The small message on the backward ring (from my next rank, to my previous one), then the
     * forward "written" one: my previous rank's iwrite into t is complete. */
    stagef(c, "ring v%d round %d: backward message from rank %d, to rank %d", v, round, next, prev);
    if (ring_message(c, rc_bwd, rbmh, rb, sc_bwd, mbmh, mb, 3, round, next, bwd_names, "backward")) return -1;
    stagef(c, "ring v%d round %d: forward message from rank %d, to rank %d", v, round, prev, next);
    if (ring_message(c, rc_fwd, rfmh, rf, sc_fwd, mfmh, mf, 4, round, prev, fwd_names, "forward")) return -1;
    if (rma) {
      size_t nbad;
      c->hc.checks++;
      long first = pat_check_at(t + off, n, seed_of(prev, 42, round), off, &nbad);
      if (first >= 0)
        return failf(c, "round %d: rank %d's iwrite of %zu B at offset %zu: %zu bytes differ here, first at %ld", round,
                     prev, n, off, nbad, first);
    }
  }
  if (sync_ranks(c, "ring done")) return -1;
  if (deregmr(c, rc_fwd, tmh, "ring") || deregmr(c, sc_bwd, smh, "ring") || deregmr(c, sc_fwd, srcmh, "ring") ||
      deregmr(c, rc_fwd, dstmh, "ring") || deregmr(c, sc_fwd, mfmh, "ring") || deregmr(c, sc_bwd, mbmh, "ring") ||
      deregmr(c, rc_fwd, rfmh, "ring") || deregmr(c, rc_bwd, rbmh, "ring"))
    return -1;
  if (nn_close_send(&c->n, sc_fwd) || nn_close_send(&c->n, sc_bwd) || nn_close_recv(&c->n, rc_fwd) ||
      nn_close_recv(&c->n, rc_bwd))
    return failf(c, "ring: close failed");
  free(t);
  free(s);
  free(src);
  free(dst);
  free(msg);
  if (me == 0)
    detailf(c, "v%d, %d ranks, %d rounds: %s, then a %d B message on the backward ring and one on the forward ring",
            v, R, RING_ROUNDS, rma ? "iwrite to the next rank and iread from the previous (8 B..1 MiB)" : "no RMA",
            RING_MSG);
  return std_teardown(c);
}

int scn_ring6(rctx_t* c) { return ring_version(c, 6); }
int scn_ring5(rctx_t* c) { return ring_version(c, 5); }

/* ------------------------------------------------------------------------------- ringcycles */

#define CYC_BYTES (256 * 1024)

/* One cycle: both rings up, fresh buffers registered, CYC_BYTES to the next rank and to the
 * previous one, everything deregistered, closed and freed. */
static int ring_cycle(rctx_t* c, int cyc) {
  const int R = c->hc.nranks, me = c->hc.rank, next = (me + 1) % R, prev = (me + R - 1) % R;
  char what[64];
  snprintf(what, sizeof what, "cycle %d", cyc);
  void *sc_fwd, *sc_bwd, *rc_fwd, *rc_bwd;
  /* Slots 0 and 1 carry the handles, numbered by cycle. */
  if (ring_connect(c, (unsigned)cyc + 1, &sc_fwd, &sc_bwd, &rc_fwd, &rc_bwd)) return -1;
  unsigned char* sf = malloc(CYC_BYTES);
  unsigned char* sb = malloc(CYC_BYTES);
  unsigned char* rf = malloc(CYC_BYTES);
  unsigned char* rb = malloc(CYC_BYTES);
  if (!sf || !sb || !rf || !rb) return failf(c, "%s: out of memory", what);
  void *sfmh, *sbmh, *rfmh, *rbmh;
  if (regmr(c, sc_fwd, sf, CYC_BYTES, &sfmh, what) || regmr(c, sc_bwd, sb, CYC_BYTES, &sbmh, what) ||
      regmr(c, rc_fwd, rf, CYC_BYTES, &rfmh, what) || regmr(c, rc_bwd, rb, CYC_BYTES, &rbmh, what))
    return -1;
  pat_fill(sf, CYC_BYTES, seed_of(cyc, me, next));
  pat_fill(sb, CYC_BYTES, seed_of(cyc, me, prev));
  void* reqs[4];
  int sizes[4] = {-1, -1, -1, -1};
  static const char* const names[4] = {"receive from the previous rank", "receive from the next rank",
                                       "send to the next rank", "send to the previous rank"};
  if (post_recv(c, rc_fwd, rf, CYC_BYTES, 5, rfmh, &reqs[0], what) ||
      post_recv(c, rc_bwd, rb, CYC_BYTES, 5, rbmh, &reqs[1], what) ||
      post_send(c, sc_fwd, sf, CYC_BYTES, 5, sfmh, &reqs[2], what) ||
      post_send(c, sc_bwd, sb, CYC_BYTES, 5, sbmh, &reqs[3], what) || ring_wait(c, reqs, sizes, 4, names, cyc))
    return -1;
  size_t nbad;
  c->hc.checks += 4;
  if (sizes[0] != CYC_BYTES || sizes[1] != CYC_BYTES)
    return failf(c, "%s: received %d and %d bytes, expected %d", what, sizes[0], sizes[1], CYC_BYTES);
  if (pat_check(rf, CYC_BYTES, seed_of(cyc, prev, me), &nbad) >= 0 ||
      pat_check(rb, CYC_BYTES, seed_of(cyc, next, me), &nbad) >= 0)
    return failf(c, "%s: %zu received bytes differ", what, nbad);
  if (deregmr(c, sc_fwd, sfmh, what) || deregmr(c, sc_bwd, sbmh, what) || deregmr(c, rc_fwd, rfmh, what) ||
      deregmr(c, rc_bwd, rbmh, what) || sync_ranks(c, what))
    return -1;
  if (nn_close_send(&c->n, sc_fwd) || nn_close_send(&c->n, sc_bwd) || nn_close_recv(&c->n, rc_fwd) ||
      nn_close_recv(&c->n, rc_bwd))
    return failf(c, "%s: close failed", what);
  free(sf);
  free(sb);
  free(rf);
  free(rb);
  return 0;
}

/* g_cycles cycles (at least 40); RSS and fds after a tenth of them (the warm-up), in the middle
 * of the rest and at the end. A leak of the cycle's buffers or registrations would grow RSS by
 * 1 MiB a cycle, of a comm's state by kilobytes a cycle, in both halves alike; the provider's
 * pools that are mapped once and touched later grow it in one half only (hc_check_growth). */
int scn_ringcycles(rctx_t* c) {
  if (std_setup(c, 6)) return -1;
  if (c->hc.nranks < 3) return failf(c, "the ring scenario needs 3 or more ranks, not %d", c->hc.nranks);
  const int ncyc = g_cycles < 40 ? 40 : g_cycles, mark = ncyc / 10, mid = mark + (ncyc - mark) / 2;
  hc_growth_t g;
  hc_growth_init(&g, mark, mid, ncyc);
  for (int cyc = 0; cyc < ncyc; cyc++) {
    stagef(c, "ring cycle %d of %d", cyc + 1, ncyc);
    if (ring_cycle(c, cyc)) return -1;
    hc_growth_sample(&g, cyc + 1);
  }
  if (std_teardown(c)) return -1;
  c->hc.checks += 3;
  return check_growth(c, &g);
}
