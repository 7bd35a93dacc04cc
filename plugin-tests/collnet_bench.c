/*
 * collnet_bench.c: the ranks of collnet_harness --bench (scripts/bench-collnet.sh): iallreduce
 * and test() timed per size, whole or cut into chunks with several in flight as NCCL's proxy
 * does, the results checked unless -c 0. collnet_harness.c prints the table.
 */
#include "collnet_harness.h"

/* ================================================================= bench */

static int bench_wait(rctx_t* c, void* req, size_t bytes) {
  int done = 0, size = -1, spins = 0;
  int64_t deadline = op_deadline(c);
  for (;;) {
    ncclResult_t r = cn_test(&c->cn, req, &done, &size);
    if (r != ncclSuccess) return failf(c, "bench: test() returned %d (%s) at %zu bytes", r, rstr(r), bytes);
    if (done) break;
    if (++spins > 64) {
      sched_yield();
      if ((spins & 1023) == 0) {
        if (check_abort(c)) return -1;
        if (now_ns() > deadline) return failf(c, "bench: %zu-byte iallreduce never completed", bytes);
      }
    }
  }
  if (size != (int)bytes) return failf(c, "bench: test() size %d, expected %zu", size, bytes);
  return 0;
}

static int bench_one(rctx_t* c, float* s, float* r, void* smh, void* rmh, size_t count) {
  void* req = NULL;
  int spins = 0;
  int64_t deadline = 0;
  for (;;) {
    ncclResult_t rc = cn_iallreduce(&c->cn, c->cc, s, r, count, 7, 0, smh, rmh, &req);
    if (rc != ncclSuccess) return failf(c, "bench: iallreduce(count %zu) returned %d (%s)", count, rc, rstr(rc));
    if (req) break;
    if (!deadline) deadline = op_deadline(c);
    if (now_ns() > deadline) return failf(c, "bench: iallreduce kept returning NULL");
    backoff(&spins);
  }
  return bench_wait(c, req, count * 4);
}

/* One size as NCCL's proxy runs it: C-byte chunks posted in order, up to K in flight, the oldest
 * polled with test() (a chunk completes in order in NCCL's FIFO, so the oldest gates the next). */
static int bench_chunked(rctx_t* c, float* s, float* r, void* smh, void* rmh, size_t count) {
  size_t per = g_bchunk / 4, nchunks = (count + per - 1) / per, posted = 0, done = 0;
  void* reqs[MAXINFLIGHT] = {0};
  int64_t deadline = op_deadline(c);
  int spins = 0;
  while (done < nchunks) {
    while (posted < nchunks && posted - done < (size_t)g_binflight) {
      size_t off = posted * per, n = count - off < per ? count - off : per;
      void* req = NULL;
      ncclResult_t rc = cn_iallreduce(&c->cn, c->cc, s + off, r + off, n, 7, 0, smh, rmh, &req);
      if (rc != ncclSuccess) return failf(c, "bench: iallreduce(chunk %zu, count %zu) returned %d (%s)", posted, n, rc, rstr(rc));
      if (!req) break; /* busy: poll what is in flight, post again later */
      reqs[posted % MAXINFLIGHT] = req;
      posted++;
    }
    if (posted > done) {
      size_t n = count - done * per < per ? count - done * per : per;
      int fin = 0, size = -1;
      ncclResult_t rc = cn_test(&c->cn, reqs[done % MAXINFLIGHT], &fin, &size);
      if (rc != ncclSuccess) return failf(c, "bench: test() of chunk %zu returned %d (%s)", done, rc, rstr(rc));
      if (fin) {
        if (size != (int)(n * 4)) return failf(c, "bench: chunk %zu: test() size %d, expected %zu", done, size, n * 4);
        done++;
        spins = 0;
        continue;
      }
    }
    if (++spins > 64) {
      sched_yield();
      if ((spins & 1023) == 0) {
        if (check_abort(c)) return -1;
        if (now_ns() > deadline) return failf(c, "bench: %zu-byte chunked iallreduce never completed", count * 4);
      }
    }
  }
  return 0;
}

static int bench_size(rctx_t* c, float* s, float* r, void* smh, void* rmh, size_t count) {
  if (g_bchunk && count * 4 > g_bchunk) return bench_chunked(c, s, r, smh, rmh, count);
  return bench_one(c, s, r, smh, rmh, count);
}

int scn_bench(rctx_t* c) {
  if (std_setup(c)) return -1;
  gbuf_t sb = {0}, rb = {0};
  if (gbuf_alloc(c, &sb, g_bmax, "send") || gbuf_alloc(c, &rb, g_bmax, "recv")) return -1;
  size_t maxcount = g_bmax / 4;
  float* s = (float*)sb.p;
  float* r = (float*)rb.p;
  for (size_t i = 0; i < maxcount; i++) s[i] = (float)((c->hc.rank + (int)(i % 7)) % 5);
  void *smh, *rmh;
  if (regmr(c, sb.p, g_bmax, &smh, "send") || regmr(c, rb.p, g_bmax, &rmh, "recv")) return -1;
  for (int k = 0; k < g_bench_nsizes; k++) {
    size_t count = g_bench_sizes[k] / 4;
    for (int i = 0; i < g_bwarm; i++)
      if (bench_size(c, s, r, smh, rmh, count)) return -1;
    if (sync_ranks(c, "bench size")) return -1;
    int64_t t0 = now_ns();
    for (int i = 0; i < g_biters; i++)
      if (bench_size(c, s, r, smh, rmh, count)) return -1;
    c->shm->bench_us[c->hc.rank][k] = (double)(now_ns() - t0) / 1e3 / g_biters;
    if (g_bcheck) {
      int bad = 0;
      for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int q = 0; q < c->hc.nranks; q++) want += (float)((q + (int)(i % 7)) % 5);
        if (r[i] != want) bad++;
      }
      c->shm->bench_bad[c->hc.rank][k] = bad;
    }
  }
  if (sync_ranks(c, "bench done")) return -1;
  if (deregmr(c, smh, "send") || deregmr(c, rmh, "recv")) return -1;
  gbuf_free(&sb);
  gbuf_free(&rb);
  return std_teardown(c);
}
