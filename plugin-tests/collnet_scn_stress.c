/*
 * collnet_scn_stress.c: the collnet_harness scenarios with several operations or communicators at
 * once, and with a failure: inflight (4 allreduces in flight on one collComm), twocomms (two
 * communicators in one process) and kill (a rank SIGKILLed during allreduces: the survivors'
 * test() must fail in time).
 */
#include "collnet_harness.h"

/* ---------------------------------------------------------------- inflight */

int scn_inflight(rctx_t* c) {
  if (std_setup(c)) return -1;
  static const struct {
    int dt, op;
    size_t count;
  } spec[4] = {{7, 0, 1 << 16}, {2, 2, 1000}, {8, 1, 4097}, {9, 0, 100000}};
  gbuf_t sb[4], rb[4];
  void *smh[4], *rmh[4];
  size_t maxb = 0;
  for (int i = 0; i < 4; i++) {
    size_t b = spec[i].count * (size_t)g_eltsize[spec[i].dt];
    if (b > maxb) maxb = b;
    if (gbuf_alloc(c, &sb[i], b, "send") || gbuf_alloc(c, &rb[i], b, "recv")) return -1;
    if (regmr(c, sb[i].p, b, &smh[i], "send") || regmr(c, rb[i].p, b, &rmh[i], "recv")) return -1;
  }
  unsigned char* scratch = malloc(maxb * (size_t)c->hc.nranks);
  if (!scratch) return failf(c, "out of memory");
  int nulls = 0;
  const int rounds = 4;
  for (int round = 0; round < rounds; round++) {
    cop_t ops[4];
    cop_t* posted[4];
    uint64_t seeds[4][MAXR];
    for (int i = 0; i < 4; i++) {
      size_t b = spec[i].count * (size_t)g_eltsize[spec[i].dt];
      for (int r = 0; r < c->hc.nranks; r++) seeds[i][r] = seed_of((uint64_t)r, 0x1F1 + (uint64_t)round * 4, (uint64_t)i);
      gen_buf(spec[i].dt, spec[i].op, MODE_EXACT, seeds[i][c->hc.rank], spec[i].count, sb[i].p);
      gbuf_arm(&rb[i], 0, b, 0x5A);
      cop_t* o = &ops[i];
      memset(o, 0, sizeof *o);
      o->kind = K_AR;
      o->send = sb[i].p;
      o->recv = rb[i].p;
      o->count = spec[i].count;
      o->dt = spec[i].dt;
      o->op = spec[i].op;
      o->smh = smh[i];
      o->rmh = rmh[i];
      snprintf(o->what, sizeof o->what, "round %d op #%d iallreduce(%s %s count %zu)", round, i, tname(o->dt),
               oname(o->op), o->count);
      if (cop_post(c, o, posted, i)) return -1;
      posted[i] = o;
      nulls += o->nulls;
    }
    /* completion order: rank- and round-dependent; each request is polled ALONE until it is done,
     * so test() on any request must make progress (ranks wait on different requests meanwhile) */
    int order[4];
    for (int i = 0; i < 4; i++) order[i] = (c->hc.rank + round + (round % 2 ? 3 * i : 4 - i)) % 4;
    int seen[4] = {0, 0, 0, 0};
    for (int i = 0; i < 4; i++) { /* make it a permutation */
      while (seen[order[i]]) order[i] = (order[i] + 1) % 4;
      seen[order[i]] = 1;
    }
    for (int i = 0; i < 4; i++) {
      cop_t* one[1] = {&ops[order[i]]};
      if (cop_wait(c, one, 1)) return -1;
    }
    for (int i = 0; i < 4; i++) {
      size_t b = spec[i].count * (size_t)g_eltsize[spec[i].dt];
      if (ops[i].size != (int)b) return failf(c, "%s: test() reported size %d, expected %zu", ops[i].what, ops[i].size, b);
      if (gbuf_guard_bad(&rb[i], 0, b) >= 0) return failf(c, "%s: written outside the recv buffer", ops[i].what);
      char msg[256] = "";
      size_t bad = check_reduction(spec[i].dt, spec[i].op, MODE_EXACT, c->hc.nranks, seeds[i], spec[i].count, rb[i].p,
                                   scratch, msg, sizeof msg);
      if (bad) return failf(c, "%s: %zu elements wrong; first: %s", ops[i].what, bad, msg);
    }
  }
  for (int i = 0; i < 4; i++) {
    if (deregmr(c, smh[i], "send") || deregmr(c, rmh[i], "recv")) return -1;
    gbuf_free(&sb[i]);
    gbuf_free(&rb[i]);
  }
  free(scratch);
  if (sync_ranks(c, "inflight done")) return -1;
  if (std_teardown(c)) return -1;
  if (c->hc.rank == 0)
    detailf(c, "%d rounds of 4 concurrent iallreduce, each polled alone in a rank-dependent order; %d NULL requests",
            rounds, nulls);
  return 0;
}

/* ---------------------------------------------------------------- twocomms */

/* Two communicators in one process, as NCCL has with two process groups: v11+ init (ctx, commId)
 * twice; each listens and connects its own collComm; operations on both are in flight at once. */
int scn_twocomms(rctx_t* c) {
  if (open_lib(c)) return -1;
  if (cn_init_checked(c, g_version, comm_id(c))) return -1;
  cn_t b = c->cn; /* same table; v11+: its own ctx from a second init */
  int own_ctx = g_version >= 11;
  if (own_ctx) {
    b.ctx = NULL;
    stagef(c, "second init (commId B)");
    ncclResult_t r = cn_init(&b, comm_id(c) + 0xB000);
    if (r != ncclSuccess) return failf(c, "second v%d init (another communicator) returned %d (%s)", g_version, r, rstr(r));
    if (b.ctx != NULL && b.ctx == c->cn.ctx) return failf(c, "the second init returned the same ctx %p as the first", b.ctx);
  }
  void *cca = NULL, *ccb = NULL;
  if (cn_connect_all(c, 0, &cca, NULL)) return -1;
  cn_t save = c->cn;
  c->cn = b;
  int rc = cn_connect_all(c, 0, &ccb, NULL);
  c->cn = save;
  if (rc) return -1;
  if (cca == ccb) return failf(c, "both communicators got the same collComm %p", cca);
  c->cc = cca;
  static const struct {
    int dt, op;
    size_t count;
  } spec[2] = {{7, 0, 100000}, {2, 2, 1000}};
  gbuf_t sb[2], rb[2];
  void *smh[2], *rmh[2];
  size_t maxb = 0;
  for (int i = 0; i < 2; i++) {
    size_t bytes = spec[i].count * (size_t)g_eltsize[spec[i].dt];
    if (bytes > maxb) maxb = bytes;
    if (gbuf_alloc(c, &sb[i], bytes, "send") || gbuf_alloc(c, &rb[i], bytes, "recv")) return -1;
    cn_t* n = i ? &b : &c->cn;
    void* cc = i ? ccb : cca;
    stagef(c, "regMr on comm %c", 'A' + i);
    smh[i] = rmh[i] = NULL;
    ncclResult_t r = cn_regmr(n, cc, sb[i].p, bytes, NCCL_PTR_HOST, &smh[i]);
    if (r == ncclSuccess) r = cn_regmr(n, cc, rb[i].p, bytes, NCCL_PTR_HOST, &rmh[i]);
    if (r != ncclSuccess || !smh[i] || !rmh[i]) return failf(c, "regMr on comm %c returned %d (%s)", 'A' + i, r, rstr(r));
  }
  unsigned char* scratch = malloc(maxb * (size_t)c->hc.nranks);
  if (!scratch) return failf(c, "out of memory");
  for (int round = 0; round < 3; round++) {
    cop_t ops[2];
    cop_t* posted[2];
    uint64_t seeds[2][MAXR];
    for (int i = 0; i < 2; i++) {
      size_t bytes = spec[i].count * (size_t)g_eltsize[spec[i].dt];
      for (int r = 0; r < c->hc.nranks; r++) seeds[i][r] = seed_of((uint64_t)r, 0x2C0 + (uint64_t)round, (uint64_t)i);
      gen_buf(spec[i].dt, spec[i].op, MODE_EXACT, seeds[i][c->hc.rank], spec[i].count, sb[i].p);
      gbuf_arm(&rb[i], 0, bytes, 0x5A);
      cop_t* o = &ops[i];
      memset(o, 0, sizeof *o);
      o->kind = K_AR;
      o->cn = i ? &b : &c->cn;
      o->cc = i ? ccb : cca;
      o->send = sb[i].p;
      o->recv = rb[i].p;
      o->count = spec[i].count;
      o->dt = spec[i].dt;
      o->op = spec[i].op;
      o->smh = smh[i];
      o->rmh = rmh[i];
      snprintf(o->what, sizeof o->what, "round %d comm %c iallreduce(%s %s count %zu)", round, 'A' + i, tname(o->dt),
               oname(o->op), o->count);
    }
    /* even rounds post A then B, odd rounds B then A; completion: the other comm's op first, alone */
    int first = round % 2;
    if (cop_post(c, &ops[first], NULL, 0)) return -1;
    posted[0] = &ops[first];
    if (cop_post(c, &ops[1 - first], posted, 1)) return -1;
    cop_t* w1[1] = {&ops[1 - first]};
    cop_t* w2[1] = {&ops[first]};
    if (cop_wait(c, w1, 1) || cop_wait(c, w2, 1)) return -1;
    for (int i = 0; i < 2; i++) {
      size_t bytes = spec[i].count * (size_t)g_eltsize[spec[i].dt];
      if (ops[i].size != (int)bytes) return failf(c, "%s: test() size %d, expected %zu", ops[i].what, ops[i].size, bytes);
      if (gbuf_guard_bad(&rb[i], 0, bytes) >= 0) return failf(c, "%s: written outside the recv buffer", ops[i].what);
      char msg[256] = "";
      size_t bad = check_reduction(spec[i].dt, spec[i].op, MODE_EXACT, c->hc.nranks, seeds[i], spec[i].count, rb[i].p,
                                   scratch, msg, sizeof msg);
      if (bad) return failf(c, "%s: %zu elements wrong; first: %s", ops[i].what, bad, msg);
    }
  }
  free(scratch);
  for (int i = 0; i < 2; i++) {
    cn_t* n = i ? &b : &c->cn;
    void* cc = i ? ccb : cca;
    ncclResult_t r = cn_deregmr(n, cc, smh[i]);
    if (r == ncclSuccess) r = cn_deregmr(n, cc, rmh[i]);
    if (r != ncclSuccess) return failf(c, "deregMr on comm %c returned %d (%s)", 'A' + i, r, rstr(r));
    gbuf_free(&sb[i]);
    gbuf_free(&rb[i]);
  }
  if (sync_ranks(c, "twocomms done")) return -1;
  /* close B (and finalize its ctx) first, then A still works for one more allreduce */
  stagef(c, "closeColl B");
  ncclResult_t r = cn_close_coll(&b, ccb);
  if (r != ncclSuccess) return failf(c, "closeColl(B) returned %d (%s)", r, rstr(r));
  if (own_ctx) {
    r = cn_finalize(&b);
    if (r != ncclSuccess) return failf(c, "finalize(ctx B) returned %d (%s)", r, rstr(r));
  }
  {
    gbuf_t s1, r1;
    void *m1, *m2;
    if (gbuf_alloc(c, &s1, 4000, "send") || gbuf_alloc(c, &r1, 4000, "recv")) return -1;
    if (regmr(c, s1.p, 4000, &m1, "send") || regmr(c, r1.p, 4000, &m2, "recv")) return -1;
    uint64_t seeds[MAXR] = {0};
    for (int q = 0; q < c->hc.nranks; q++) seeds[q] = seed_of((uint64_t)q, 0x2CF, 0);
    gen_buf(7, 0, MODE_EXACT, seeds[c->hc.rank], 1000, s1.p);
    cop_t o;
    memset(&o, 0, sizeof o);
    o.kind = K_AR;
    o.send = s1.p;
    o.recv = r1.p;
    o.count = 1000;
    o.dt = 7;
    o.op = 0;
    o.smh = m1;
    o.rmh = m2;
    snprintf(o.what, sizeof o.what, "comm A iallreduce(float sum count 1000) after comm B was closed%s",
             own_ctx ? " and finalized" : "");
    if (cop_run(c, &o)) return -1;
    unsigned char* sc = malloc(4000 * (size_t)c->hc.nranks);
    char msg[256] = "";
    if (!sc) return failf(c, "out of memory");
    size_t bad = check_reduction(7, 0, MODE_EXACT, c->hc.nranks, seeds, 1000, r1.p, sc, msg, sizeof msg);
    free(sc);
    if (bad) return failf(c, "%s: %zu elements wrong; first: %s", o.what, bad, msg);
    if (deregmr(c, m1, "send") || deregmr(c, m2, "recv")) return -1;
    gbuf_free(&s1);
    gbuf_free(&r1);
  }
  if (sync_ranks(c, "comm A done")) return -1;
  if (std_teardown(c)) return -1;
  if (c->hc.rank == 0)
    detailf(c, "2 collComms%s, 3 rounds with one allreduce in flight on each; A still works after B closed",
            own_ctx ? " from 2 init ctxs" : " (one init: v6-v10)");
  return 0;
}

/* ---------------------------------------------------------------- kill */

#define KILL_COUNT ((size_t)2 << 20) /* 8 MiB of floats */

int scn_kill(rctx_t* c) {
  if (std_setup(c)) return -1;
  const int victim = c->hc.rank == g_kill_victim;
  gbuf_t sb = {0}, rb = {0};
  size_t bytes = KILL_COUNT * 4;
  if (gbuf_alloc(c, &sb, bytes, "send") || gbuf_alloc(c, &rb, bytes, "recv")) return -1;
  for (size_t i = 0; i < KILL_COUNT; i++) ((float*)sb.p)[i] = (float)(c->hc.rank + 1);
  void *smh, *rmh;
  if (regmr(c, sb.p, bytes, &smh, "send") || regmr(c, rb.p, bytes, &rmh, "recv")) return -1;
  const float want = (float)(c->hc.nranks * (c->hc.nranks + 1) / 2);
  long long completed = 0, after = 0;
  int64_t start = now_ns(), limit_ns = (int64_t)(g_kill_timeout_ms + 5000) * 1000000LL;
  ncclResult_t err = ncclSuccess;
  const char* where = "";
  int spins = 0;
  for (;;) {
    /* post */
    void* req = NULL;
    cop_t o;
    memset(&o, 0, sizeof o);
    snprintf(o.what, sizeof o.what, "iallreduce #%lld (float sum, 8 MiB)", completed);
    stagef(c, "post %s", o.what);
    for (;;) {
      ncclResult_t r = cn_iallreduce(&c->cn, c->cc, sb.p, rb.p, KILL_COUNT, 7, 0, smh, rmh, &req);
      if (r != ncclSuccess) {
        err = r;
        where = "iallreduce()";
        break;
      }
      if (req) break;
      int64_t kn = atomic_load(&c->shm->b.kill_ns);
      if (kn && now_ns() > kn + limit_ns) break;
      if (now_ns() - start > 120000000000LL) return failf(c, "iallreduce kept returning NULL");
      backoff(&spins);
    }
    if (err == ncclSuccess && req) {
      stagef(c, "test %s", o.what);
      int done = 0, size = -1;
      spins = 0;
      for (;;) {
        ncclResult_t r = cn_test(&c->cn, req, &done, &size);
        if (r != ncclSuccess) {
          err = r;
          where = "test()";
          break;
        }
        if (done) break;
        int64_t kn = atomic_load(&c->shm->b.kill_ns);
        if (kn && now_ns() > kn + limit_ns) break;
        if (!kn && now_ns() - start > 90000000000LL)
          return failf(c, "%s never completed and the parent never killed the victim", o.what);
        backoff(&spins);
      }
      if (err == ncclSuccess && done) {
        if (size != (int)bytes) return failf(c, "%s: test() size %d, expected %zu", o.what, size, bytes);
        if (((float*)rb.p)[0] != want || ((float*)rb.p)[KILL_COUNT - 1] != want)
          return failf(c, "%s: wrong result %g (expected %g)", o.what, (double)((float*)rb.p)[0], (double)want);
        completed++;
        if (atomic_load(&c->shm->b.kill_ns)) after++;
        atomic_store(&c->shm->b.progress[c->hc.rank], completed);
      }
    }
    int64_t kn = atomic_load(&c->shm->b.kill_ns);
    if (err != ncclSuccess) {
      if (victim || !kn)
        return failf(c, "%s returned %d (%s) before any rank was killed (after %lld completed)", where, err, rstr(err),
                     completed);
      break;
    }
    if (victim && now_ns() - start > 120000000000LL) return failf(c, "the victim was never killed");
    if (kn && now_ns() > kn + limit_ns)
      return failf(c, "no error %.1f s after rank %d was SIGKILLed (limit: FABRICOLL_TIMEOUT_MS=%d + 5 s); %lld "
                   "collectives completed after the kill, stage: %s", (double)(now_ns() - kn) / 1e9, g_kill_victim,
                   g_kill_timeout_ms, after, c->shm->b.stage[c->hc.rank]);
  }
  double ms = (double)(now_ns() - atomic_load(&c->shm->b.kill_ns)) / 1e6;
  stagef(c, "closeColl after the error");
  int64_t t0 = now_ns();
  ncclResult_t r = cn_close_coll(&c->cn, c->cc);
  c->cc = NULL;
  double cms = ms_since(t0);
  atomic_store(&c->shm->closed_ns[c->hc.rank], now_ns());
  vlog("[kill rank %d] closeColl returned %d after %.1f ms\n", c->hc.rank, r, cms);
  if (cms > 10000) return failf(c, "closeColl after the error took %.0f ms", cms);
  r = cn_finalize(&c->cn);
  atomic_store(&c->shm->kerr[c->hc.rank], (int)err);
  atomic_store(&c->shm->kms_x10[c->hc.rank], (long long)(ms * 10));
  atomic_store(&c->shm->kdone[c->hc.rank], completed - after);
  vlog("[kill rank %d] %s returned %d (%s) %.0f ms after the SIGKILL\n", c->hc.rank, where, err, rstr(err), ms);
  return 0;
}
