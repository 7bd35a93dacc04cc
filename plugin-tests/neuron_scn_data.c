/*
 * neuron_scn_data.c: the neuron_harness scenarios that move data: transfers of 0 B to 64 MiB
 * through each table version, 128 requests in flight on one comm, a 2.5 GiB and a sub-page
 * registration, and RMA (getMrKey, iwrite, iwriteInline, iread) between two processes.
 */
#include "neuron_harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ------------------------------------------------------------------------------------ xfer */

static const size_t xfer_sizes[] = {0,     1,     7,          8,          63,       64,       4095,
                                    4096,  4097,  65536,      65537,      MIB - 1,  MIB + 3,  4 * MIB,
                                    16 * MIB + 5, 64 * MIB};
#define NXFER ((int)(sizeof xfer_sizes / sizeof xfer_sizes[0]))

/* Every size from rank 0 to rank 1 and back, into a receive buffer 64 bytes larger; v5/v6 also
 * iflush each receive (host memory: done at once, or no request at all). */
static int xfer_version(rctx_t* c, int v) {
  if (std_setup(c, v)) return -1;
  void *sc0, *rc0, *sc1, *rc1;
  if (pair_one_way(c, 0, 1, &sc0, &rc1, 0, 1, "xfer setup")) return -1;
  if (pair_one_way(c, 1, 0, &sc1, &rc0, 1, 1, "xfer setup")) return -1;
  void* sc = c->hc.rank == 0 ? sc0 : sc1;
  void* rc = c->hc.rank == 0 ? rc0 : rc1;
  const size_t max = 64 * MIB, cap = max + 64;
  unsigned char* sb = xalloc(c, max, "send buffer");
  unsigned char* rb = xalloc(c, cap, "recv buffer");
  void *smh, *rmh;
  if (!sb || !rb || regmr(c, sc, sb, max, &smh, "xfer") || regmr(c, rc, rb, cap, &rmh, "xfer")) return -1;
  int flush_reqs = 0, flush_nulls = 0;
  for (int dir = 0; dir < 2; dir++) {
    for (int i = 0; i < NXFER; i++) {
      size_t sz = xfer_sizes[i];
      char what[96];
      snprintf(what, sizeof what, "v%d %zu B rank %d->%d", v, sz, dir, 1 - dir);
      uint64_t seed = seed_of(v, dir, i);
      int sender = c->hc.rank == dir;
      if (sender ? xfer(c, sc, smh, sb, NULL, NULL, NULL, 0, sz, seed, what)
                 : xfer(c, NULL, NULL, NULL, rc, rmh, rb, sz + 64, sz, seed, what))
        return -1;
      if (!sender && v != 4) {
        void* req = NULL;
        void* d = rb;
        int s = (int)sz;
        ncclResult_t r = nn_iflush(&c->n, rc, 1, &d, &s, &rmh, &req);
        c->hc.checks++;
        if (r != ncclSuccess) return failf(c, "%s: iflush returned %d (%s)", what, r, rstr(r));
        if (!req) {
          flush_nulls++;
        } else {
          int done = 0, sizes[1] = {-1};
          r = nn_test(&c->n, req, &done, sizes);
          c->hc.checks++;
          if (r != ncclSuccess || !done)
            return failf(c, "%s: the iflush request on host memory is not done at the first test (%d, %s, done %d)",
                         what, r, rstr(r), done);
          flush_reqs++;
        }
      }
    }
  }
  if (deregmr(c, sc, smh, "xfer") || deregmr(c, rc, rmh, "xfer")) return -1;
  if (sync_ranks(c, "xfer done")) return -1;
  if (nn_close_send(&c->n, sc) != ncclSuccess || nn_close_recv(&c->n, rc) != ncclSuccess)
    return failf(c, "xfer: close failed");
  free(sb);
  free(rb);
  if (v == 4) detailf(c, "v4: %d sizes 0 B..64 MiB each way", NXFER);
  else if (c->hc.rank == 1)
    detailf(c, "v%d: %d sizes 0 B..64 MiB each way; iflush %d requests, %d NULL", v, NXFER, flush_reqs, flush_nulls);
  return std_teardown(c);
}

int scn_xfer6(rctx_t* c) { return xfer_version(c, 6); }
int scn_xfer5(rctx_t* c) { return xfer_version(c, 5); }
int scn_xfer4(rctx_t* c) { return xfer_version(c, 4); }

/* -------------------------------------------------------------------------------- inflight */

#define NFLIGHT NCCL_NET_MAX_REQUESTS

static size_t flight_size(int i) { return i % 16 == 15 ? 65536 + (size_t)i : 100 + (size_t)i * 37; }

/* Rank 1 posts 128 irecvs (each must give a request), then rank 0 posts 128 isends (retrying a
 * NULL request without testing any other), so 128 are outstanding on each comm; then test all. */
int scn_inflight(rctx_t* c) {
  if (std_setup(c, 6)) return -1;
  void *sc, *rc;
  if (pair_one_way(c, 0, 1, &sc, &rc, 0, 1, "inflight setup")) return -1;
  const size_t cap = 65536 + NFLIGHT + 64;
  void* comm = c->hc.rank == 0 ? sc : rc;
  unsigned char* buf = xalloc(c, cap * NFLIGHT, "inflight buffers");
  void* mh;
  if (!buf || regmr(c, comm, buf, cap * NFLIGHT, &mh, "inflight")) return -1;
  void* req[NFLIGHT] = {0};
  int retries = 0;
  if (c->hc.rank == 1) {
    memset(buf, 0xA5, cap * NFLIGHT);
    for (int i = 0; i < NFLIGHT; i++) {
      ncclResult_t r = nn_irecv1(&c->n, rc, buf + cap * i, (int)cap, i, mh, &req[i]);
      c->hc.checks++;
      if (r != ncclSuccess || !req[i])
        return failf(c, "irecv %d of %d returned %d (%s), request %p: 128 receives must be accepted", i + 1,
                     NFLIGHT, r, rstr(r), req[i]);
    }
  }
  if (sync_ranks(c, "receives posted")) return -1;
  if (c->hc.rank == 0) {
    int64_t deadline = op_deadline(c);
    for (int i = 0; i < NFLIGHT; i++) {
      unsigned char* b = buf + cap * i;
      pat_fill(b, flight_size(i), seed_of(i, 7, 7));
      int spins = 0;
      for (;;) {
        ncclResult_t r = nn_isend(&c->n, sc, b, (int)flight_size(i), i, mh, &req[i]);
        if (r != ncclSuccess) return failf(c, "isend %d returned %d (%s)", i + 1, r, rstr(r));
        if (req[i]) break;
        retries++;
        if (now_ns() > deadline)
          return failf(c, "isend %d of %d kept returning a NULL request with %d outstanding (none tested)", i + 1,
                       NFLIGHT, i);
        backoff(&spins);
      }
      c->hc.checks++;
    }
  }
  /* All 128 are outstanding; now test them all. */
  int left = NFLIGHT, spins = 0;
  int64_t deadline = op_deadline(c);
  while (left) {
    for (int i = 0; i < NFLIGHT; i++) {
      if (!req[i]) continue;
      int done = 0, sizes[1] = {-1};
      ncclResult_t r = nn_test(&c->n, req[i], &done, sizes);
      if (r != ncclSuccess) return failf(c, "test of request %d returned %d (%s)", i, r, rstr(r));
      if (!done) continue;
      req[i] = NULL;
      left--;
      if (c->hc.rank == 1) {
        size_t sz = flight_size(i), nbad;
        c->hc.checks += 2;
        if (sizes[0] != (int)sz) return failf(c, "receive %d reports %d bytes, expected %zu", i, sizes[0], sz);
        long first = pat_check_at(buf + cap * i, sz, seed_of(i, 7, 7), 0, &nbad);
        if (first >= 0) return failf(c, "receive %d: %zu bytes differ, first at %ld", i, nbad, first);
      }
    }
    if (check_abort(c)) return -1;
    if (now_ns() > deadline) return failf(c, "%d of %d requests not done within %d ms", left, NFLIGHT, g_op_timeout_ms);
    backoff(&spins);
  }
  if (deregmr(c, comm, mh, "inflight") || sync_ranks(c, "inflight done")) return -1;
  if ((c->hc.rank == 0 ? nn_close_send(&c->n, sc) : nn_close_recv(&c->n, rc)) != ncclSuccess)
    return failf(c, "inflight: close failed");
  free(buf);
  if (c->hc.rank == 0) detailf(c, "%d isends and %d irecvs outstanding; %d NULL-request retries", NFLIGHT, NFLIGHT, retries);
  return std_teardown(c);
}

/* ---------------------------------------------------------------------------------- bigreg */

#define BIG (5UL * 512 * MIB) /* 2.5 GiB */

int scn_bigreg(rctx_t* c) {
  if (std_setup(c, 6)) return -1;
  void *sc, *rc;
  if (pair_loopback(c, &sc, &rc, "bigreg pair")) return -1;
  unsigned char* big = mmap(NULL, BIG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (big == MAP_FAILED) return failf(c, "mmap of 2.5 GiB (MAP_NORESERVE) failed");
  void *bmh, *rmh, *smh, *zmh;
  stagef(c, "regMr 2.5 GiB");
  if (regmr(c, sc, big, BIG, &bmh, "2.5 GiB")) return -1;
  c->hc.checks++;
  /* Send from above 2 GiB through the big registration: a size or offset cut to 32 bits breaks. */
  const size_t off = BIG - 3 * MIB + 17, sz = MIB + 5;
  unsigned char* rb = xalloc(c, sz + 64, "recv");
  if (!rb || regmr(c, rc, rb, sz + 64, &rmh, "bigreg recv")) return -1;
  if (xfer(c, sc, bmh, big + off, rc, rmh, rb, sz + 64, sz, 0xB16, "1 MiB from 2.5 GiB - 3 MiB")) return -1;
  if (deregmr(c, sc, bmh, "2.5 GiB")) return -1;
  c->hc.checks++;
  /* Sub-page: 100 bytes at offset 17 of a page, registered exactly, then sent from. */
  unsigned char* page = xalloc(c, 8192, "page");
  if (!page || regmr(c, sc, page + 17, 100, &smh, "sub-page")) return -1;
  if (xfer(c, sc, smh, page + 17, rc, rmh, rb, 164, 100, 0x5B, "100 B from a sub-page registration")) return -1;
  if (deregmr(c, sc, smh, "sub-page")) return -1;
  /* Size 0 is fine. */
  if (regmr(c, sc, page, 0, &zmh, "0-byte registration") || deregmr(c, sc, zmh, "0-byte registration")) return -1;
  c->hc.checks += 2;
  if (deregmr(c, rc, rmh, "bigreg recv")) return -1;
  if (nn_close_send(&c->n, sc) || nn_close_recv(&c->n, rc)) return failf(c, "bigreg: close failed");
  munmap(big, BIG);
  free(rb);
  free(page);
  detailf(c, "2.5 GiB, 100 B sub-page and 0 B registrations");
  return std_teardown(c);
}

/* ------------------------------------------------------------------------------------- rma */

/* The target region of each rank: [0, RD) is read by the peer, [RD, RD + WR) written by the
 * peer's iwrite, [RD + WR, TSZ) by its iwriteInline. */
#define RD (256 * 1024)
#define WR (256 * 1024)
#define TSZ (RD + WR + 64 * 1024)

static const struct {
  size_t off, size;
} rma_ops[] = {{3, 1}, {100, 4093}, {8192, 65541}, {100000, 150000}};
#define NRMA ((int)(sizeof rma_ops / sizeof rma_ops[0]))

typedef struct {
  uint64_t addr, key;
} remote_t;

/* Post an RMA op (retrying a NULL request) and wait for it; test reports the size in sizes[0]. */
static int rma_wait(rctx_t* c, const char* what, size_t size, ncclResult_t (*post)(rctx_t*, void*, void**), void* arg) {
  void* req = NULL;
  int64_t deadline = op_deadline(c);
  int spins = 0;
  for (;;) {
    ncclResult_t r = post(c, arg, &req);
    if (r != ncclSuccess) return failf(c, "%s: returned %d (%s)", what, r, rstr(r));
    if (req) break;
    if (now_ns() > deadline) return failf(c, "%s: kept returning a NULL request", what);
    backoff(&spins);
  }
  int got = -1;
  if (wait_req(c, req, &got, what)) return -1;
  c->hc.checks++;
  if (got != (int)size) return failf(c, "%s: test reported %d bytes, expected %zu", what, got, size);
  return 0;
}

typedef struct {
  void* comm;
  void* buf;
  size_t size;
  void* mh;
  uint64_t raddr, key;
} rma_arg_t;

static ncclResult_t post_write(rctx_t* c, void* a, void** req) {
  rma_arg_t* x = a;
  return nn_iwrite(&c->n, x->comm, x->buf, x->size, x->mh, x->raddr, x->key, req);
}
static ncclResult_t post_inline(rctx_t* c, void* a, void** req) {
  rma_arg_t* x = a;
  ncclResult_t r = nn_iwrite_inline(&c->n, x->comm, x->buf, x->size, x->raddr, x->key, req);
  if (r == ncclSuccess && *req) memset(x->buf, 0xEE, x->size); /* src may be reused at once */
  return r;
}
static ncclResult_t post_read(rctx_t* c, void* a, void** req) {
  rma_arg_t* x = a;
  return nn_iread(&c->n, x->comm, x->buf, x->size, x->mh, x->raddr, x->key, req);
}

/* A barrier through the library (8 bytes each way): unlike sync_ranks it keeps both processes
 * calling into the library, which a provider with manual progress needs to serve the peer's RMA. */
static int net_barrier(rctx_t* c, void* sc, void* smh, unsigned char* sb, void* rc, void* rmh, unsigned char* rb,
                       const char* what) {
  void *rreq, *sreq;
  if (post_recv(c, rc, rb, 8, 77, rmh, &rreq, what) || post_send(c, sc, sb, 8, 77, smh, &sreq, what)) return -1;
  return wait_req(c, sreq, NULL, what) || wait_req(c, rreq, NULL, what) ? -1 : 0;
}

static int rma_unsupported(rctx_t* c, void* sc, void* rc) {
  errs_t e = {{0}, 0};
  unsigned char* b = xalloc(c, 4096, "rma");
  void* mh;
  if (!b || regmr(c, sc, b, 4096, &mh, "rma")) return -1;
  uint64_t key = 0;
  void* req = NULL;
  EXPECT_RC(c, &e, "getMrKey (rma_supported 0)", nn_getmrkey(&c->n, mh, &key), ncclSystemError);
  EXPECT_RC(c, &e, "iwrite (rma_supported 0)", nn_iwrite(&c->n, sc, b, 8, mh, (uintptr_t)b, 0, &req), ncclSystemError);
  EXPECT_RC(c, &e, "iwriteInline (rma_supported 0)", nn_iwrite_inline(&c->n, sc, b, 8, (uintptr_t)b, 0, &req),
            ncclSystemError);
  EXPECT_RC(c, &e, "iread (rma_supported 0)", nn_iread(&c->n, rc, b, 8, mh, (uintptr_t)b, 0, &req), ncclSystemError);
  if (deregmr(c, sc, mh, "rma")) return -1;
  free(b);
  detailf(c, "v%d rma_supported 0: the four calls return SystemError", c->n.v);
  return errs_finish(c, &e, "rma (unsupported)");
}

static int rma_version(rctx_t* c, int v) {
  if (std_setup(c, v)) return -1;
  void *sc0, *rc0, *sc1, *rc1;
  if (pair_one_way(c, 0, 1, &sc0, &rc1, 0, 1, "rma setup")) return -1;
  if (pair_one_way(c, 1, 0, &sc1, &rc0, 1, 1, "rma setup")) return -1;
  void* sc = c->hc.rank == 0 ? sc0 : sc1;
  void* rc = c->hc.rank == 0 ? rc0 : rc1;
  const int peer = 1 - c->hc.rank;
  if (c->props.rma_supported != 1) {
    if (rma_unsupported(c, sc, rc)) return -1;
  } else {
    const size_t inl = c->props.max_write_inline_size;
    /* My target region, registered on my recv comm; its address and key go to the peer. */
    unsigned char* t = xalloc(c, TSZ, "rma target");
    unsigned char* src = xalloc(c, RD, "rma source");
    unsigned char* dst = xalloc(c, RD, "rma read destination");
    void *tmh, *smh, *dmh;
    if (!t || !src || !dst || regmr(c, rc, t, TSZ, &tmh, "rma target")) return -1;
    if (regmr(c, sc, src, RD, &smh, "rma source") || regmr(c, rc, dst, RD, &dmh, "rma read destination")) return -1;
    memset(t, 0, TSZ);
    pat_fill(t, RD, seed_of(c->hc.rank, 31, 0));
    remote_t mine = {(uintptr_t)t, 0}, theirs;
    ncclResult_t r = nn_getmrkey(&c->n, tmh, &mine.key);
    c->hc.checks++;
    if (r != ncclSuccess) return failf(c, "getMrKey returned %d (%s)", r, rstr(r));
    unsigned char msg[HSIZE] = {0};
    memcpy(msg, &mine, sizeof mine);
    publish(c, 2, 1, msg);
    if (fetch(c, peer, 2, 1, msg, "peer's address and key")) return -1;
    memcpy(&theirs, msg, sizeof theirs);
    /* Reads from the peer's [0, RD), checked against the pattern it filled in. */
    for (int i = 0; i < NRMA; i++) {
      char what[96];
      snprintf(what, sizeof what, "iread %zu B at offset %zu", rma_ops[i].size, rma_ops[i].off);
      memset(dst, 0, rma_ops[i].size);
      rma_arg_t a = {rc, dst, rma_ops[i].size, dmh, theirs.addr + rma_ops[i].off, theirs.key};
      if (rma_wait(c, what, rma_ops[i].size, post_read, &a)) return -1;
      size_t nbad;
      c->hc.checks++;
      long first = pat_check_at(dst, rma_ops[i].size, seed_of(peer, 31, 0), rma_ops[i].off, &nbad);
      if (first >= 0) return failf(c, "%s: %zu bytes differ, first at %ld", what, nbad, first);
    }
    /* Writes into the peer's [RD, RD + WR) and, inline, its [RD + WR, TSZ). */
    for (int i = 0; i < NRMA; i++) {
      char what[96];
      snprintf(what, sizeof what, "iwrite %zu B at offset %zu", rma_ops[i].size, RD + rma_ops[i].off);
      pat_fill_at(src, rma_ops[i].size, seed_of(c->hc.rank, 32, 0), RD + rma_ops[i].off);
      rma_arg_t a = {sc, src, rma_ops[i].size, smh, theirs.addr + RD + rma_ops[i].off, theirs.key};
      if (rma_wait(c, what, rma_ops[i].size, post_write, &a)) return -1;
    }
    /* Four disjoint slices of [RD + WR, TSZ); each size is capped at its slice's length. */
    const size_t isz[4] = {1, inl < 8 ? inl : 8, inl / 2 ? inl / 2 : 1, inl};
    const size_t ioff[4] = {RD + WR, RD + WR + 9, RD + WR + 4096, RD + WR + 32768};
    const size_t ilen[4] = {9, 4096 - 9, 32768 - 4096, TSZ - (RD + WR + 32768)};
    for (int i = 0; i < 4; i++) {
      size_t n = isz[i] < ilen[i] ? isz[i] : ilen[i];
      char what[96];
      unsigned char ib[32768];
      snprintf(what, sizeof what, "iwriteInline %zu B at offset %zu", n, ioff[i]);
      pat_fill_at(ib, n, seed_of(c->hc.rank, 32, 0), ioff[i]);
      rma_arg_t a = {sc, ib, n, NULL, theirs.addr + ioff[i], theirs.key};
      if (rma_wait(c, what, n, post_inline, &a)) return -1;
    }
    unsigned char* big = calloc(1, inl + 1);
    void* req = NULL;
    if (!big) return failf(c, "out of memory");
    r = nn_iwrite_inline(&c->n, sc, big, inl + 1, theirs.addr + RD + WR, theirs.key, &req);
    free(big);
    c->hc.checks++;
    if (r != ncclInvalidArgument)
      return failf(c, "iwriteInline of max_write_inline_size + 1 = %zu B returned %d (%s), expected InvalidArgument",
                   inl + 1, r, rstr(r));
    /* The peer wrote into my region: check it (the peer's completions came before this barrier). */
    if (net_barrier(c, sc, smh, src, rc, dmh, dst, "rma writes done")) return -1;
    for (int i = 0; i < NRMA; i++) {
      size_t nbad, o = RD + rma_ops[i].off;
      c->hc.checks++;
      long first = pat_check_at(t + o, rma_ops[i].size, seed_of(peer, 32, 0), o, &nbad);
      if (first >= 0)
        return failf(c, "the peer's iwrite of %zu B at offset %zu: %zu bytes differ here, first at %ld",
                     rma_ops[i].size, o, nbad, first);
    }
    for (int i = 0; i < 4; i++) {
      size_t n = isz[i] < ilen[i] ? isz[i] : ilen[i], nbad;
      c->hc.checks++;
      long first = pat_check_at(t + ioff[i], n, seed_of(peer, 32, 0), ioff[i], &nbad);
      if (first >= 0)
        return failf(c, "the peer's iwriteInline of %zu B at offset %zu: %zu bytes differ, first at %ld", n, ioff[i],
                     nbad, first);
    }
    if (net_barrier(c, sc, smh, src, rc, dmh, dst, "rma checked")) return -1;
    if (deregmr(c, rc, tmh, "rma") || deregmr(c, sc, smh, "rma") || deregmr(c, rc, dmh, "rma")) return -1;
    free(t);
    free(src);
    free(dst);
    detailf(c, "v%d rma_supported 1: %d iread, %d iwrite, 4 iwriteInline (max %zu B) checked each way", v, NRMA, NRMA,
            inl);
  }
  if (sync_ranks(c, "rma done")) return -1;
  if (nn_close_send(&c->n, sc) || nn_close_recv(&c->n, rc)) return failf(c, "rma: close failed");
  return std_teardown(c);
}

int scn_rma6(rctx_t* c) { return rma_version(c, 6); }
int scn_rma5(rctx_t* c) { return rma_version(c, 5); }
