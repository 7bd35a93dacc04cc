/*
 * collnet_util.c: the helpers of collnet_harness's scenarios (see collnet_harness.h): guarded
 * buffers, opening the library and checking its properties, the handle exchange and connect of
 * every rank's collComm, setup and teardown, regMr/deregMr, and posting, polling and waiting for
 * collective operations with deadlines.
 */
#include "collnet_harness.h"

/* ---------------------------------------------------------------- guarded buffers (gbuf_t) */

int gbuf_alloc(rctx_t* c, gbuf_t* b, size_t size, const char* what) {
  memset(b, 0, sizeof *b);
  b->size = size;
  b->alloc = (size + 2 * GUARD + 4095) & ~(size_t)4095;
  b->base = aligned_alloc(4096, b->alloc);
  if (!b->base) return failf(c, "out of memory allocating %zu bytes for %s", size, what);
  memset(b->base, CANARY, b->alloc);
  b->p = b->base + GUARD;
  return 0;
}
void gbuf_free(gbuf_t* b) {
  free(b->base);
  b->base = b->p = NULL;
}
/* resets the canaries around [p+off, p+off+len) and fills that range with `fill` */
void gbuf_arm(gbuf_t* b, size_t off, size_t len, int fill) {
  memset(b->base, CANARY, GUARD + off);
  memset(b->p + off, fill, len);
  memset(b->p + off + len, CANARY, b->alloc - GUARD - off - len);
}
/* the index of the first byte of p[0, n) that is not CANARY, or n. The scenarios check megabytes
 * of guards per call: once a prefix is known to be canaries, the next stretch (as long as the
 * prefix, at most) is compared with it by memcmp. */
static size_t first_not_canary(const unsigned char* p, size_t n) {
  size_t i = 0;
  while (i < n && i < 64) {
    if (p[i] != CANARY) return i;
    i++;
  }
  while (i < n) {
    size_t k = n - i < i ? n - i : i;
    if (memcmp(p + i, p, k) != 0) {
      while (p[i] == CANARY) i++;
      return i;
    }
    i += k;
  }
  return n;
}
/* first changed canary byte outside [p+off, p+off+len), or -1 */
long gbuf_guard_bad(const gbuf_t* b, size_t off, size_t len) {
  size_t lo = GUARD + off, hi = GUARD + off + len, end = GUARD + b->size + GUARD;
  size_t i = first_not_canary(b->base, lo);
  if (i < lo) return (long)i - GUARD;
  i = hi + first_not_canary(b->base + hi, end - hi);
  if (i < end) return (long)i - GUARD;
  return -1;
}

/* ---------------------------------------------------------------- setup: open, init, connect */

static int check_props(rctx_t* c, int v, int dev, const unsigned char* buf, size_t bufsz, net_props_t* out) {
  size_t sz = net_props_size(v);
  for (size_t i = sz; i < bufsz; i++)
    if (buf[i] != 0xCD)
      return failf(c, "v%d getProperties(%d) wrote past sizeof(ncclNetProperties_v%d_t) = %zu (byte %zu changed)", v, dev,
                   v, sz, i);
  net_props_t p;
  net_props_decode(v, buf, &p);
  if (p.name == NULL || strnlen(p.name, 256) == 0 || strnlen(p.name, 256) >= 256)
    return failf(c, "v%d getProperties(%d): name is NULL, empty or unterminated", v, dev);
  if (!(p.ptrSupport & NCCL_PTR_HOST))
    return failf(c, "v%d getProperties(%d): ptrSupport 0x%x lacks NCCL_PTR_HOST", v, dev, p.ptrSupport);
  if (p.speed <= 0) return failf(c, "v%d getProperties(%d): speed %d <= 0", v, dev, p.speed);
  if (!(p.latency >= 0.0f) || isinf(p.latency))
    return failf(c, "v%d getProperties(%d): latency %g invalid", v, dev, (double)p.latency);
  if (p.maxComms <= 0) return failf(c, "v%d getProperties(%d): maxComms %d <= 0", v, dev, p.maxComms);
  if (v >= 7 && (p.netDeviceType != NCCL_NET_DEVICE_HOST || p.netDeviceVersion != 0))
    return failf(c, "v%d getProperties(%d): netDeviceType %d / version %d, expected HOST (0) / 0", v, dev,
                 p.netDeviceType, p.netDeviceVersion);
  if (v >= 8 && p.regIsGlobal != 0 && p.regIsGlobal != 1)
    return failf(c, "v%d getProperties(%d): regIsGlobal %d not 0/1", v, dev, p.regIsGlobal);
  if (v >= 9) {
    if (p.maxCollBytes == 0 || p.maxCollBytes > NCCL_MAX_NET_SIZE_BYTES)
      return failf(c, "v%d getProperties(%d): maxCollBytes %zu not in (0, 1 TiB]", v, dev, p.maxCollBytes);
    if (p.maxP2pBytes == 0 || p.maxP2pBytes > NCCL_MAX_NET_SIZE_BYTES)
      return failf(c, "v%d getProperties(%d): maxP2pBytes %zu not in (0, 1 TiB]", v, dev, p.maxP2pBytes);
    int maxv = v >= 12 ? NCCL_NET_MAX_DEVS_PER_NIC_V12 : NCCL_NET_MAX_DEVS_PER_NIC_V9;
    if (p.vndevs < 0 || p.vndevs > maxv)
      return failf(c, "v%d getProperties(%d): vProps.ndevs %d not in [0, %d]", v, dev, p.vndevs, maxv);
  }
  if (v >= 11 && p.maxMultiRequestSize < 1)
    return failf(c, "v%d getProperties(%d): maxMultiRequestSize %d < 1", v, dev, p.maxMultiRequestSize);
  if (out) *out = p;
  return 0;
}

int open_lib(rctx_t* c) {
  if (c->dl) return 0;
  stagef(c, "dlopen %s", g_lib);
  dlerror();
  c->dl = dlopen(g_lib, RTLD_NOW | RTLD_LOCAL);
  if (!c->dl) {
    const char* e = dlerror();
    return failf(c, "dlopen(%s) failed: %s", g_lib, e ? e : "?");
  }
  /* every version must resolve (NCCL picks the newest it knows) */
  for (int v = NET_MIN_VERSION; v <= NET_MAX_VERSION; v++) {
    cn_t t;
    char err[256];
    if (cn_bind(&t, c->dl, v, err, sizeof err) != 0) return failf(c, "%s", err);
  }
  return 0;
}

/* Handles all-gather through the mapping: returns all nranks handles in rank order. */
static int exchange_handles(rctx_t* c, const unsigned char* mine, unsigned char (*all)[HSIZE]) {
  unsigned gen = ++c->gen;
  memcpy(c->shm->handle[c->hc.rank], mine, HSIZE);
  atomic_store_explicit(&c->shm->hseq[c->hc.rank], gen, memory_order_release);
  stagef(c, "waiting for the handles of generation %u", gen);
  int64_t deadline = op_deadline(c);
  int spins = 0;
  for (int r = 0; r < c->hc.nranks; r++) {
    while (atomic_load_explicit(&c->shm->hseq[r], memory_order_acquire) < gen) {
      if (check_abort(c)) return -1;
      if (now_ns() > deadline) return failf(c, "timed out waiting for rank %d's handle (generation %u)", r, gen);
      backoff(&spins);
    }
    memcpy(all[r], c->shm->handle[r], HSIZE);
  }
  /* nobody overwrites its slot (next generation) before everybody has read this one */
  return sync_ranks(c, "handles read");
}

/* listen + all-gather + connect (one call) + closeListen, on table c->cn (already initialised). */
int cn_connect_all(rctx_t* c, int dev, void** ccout, double* connect_ms) {
  unsigned char buf[HSIZE + 64];
  memset(buf, 0xEE, sizeof buf);
  void* lc = NULL;
  stagef(c, "v%d listen(dev %d)", c->cn.version, dev);
  ncclResult_t r = cn_listen(&c->cn, dev, buf, &lc);
  if (r != ncclSuccess) return failf(c, "v%d listen(dev %d) returned %d (%s)", c->cn.version, dev, r, rstr(r));
  if (lc == NULL) return failf(c, "v%d listen returned ncclSuccess with a NULL listenComm", c->cn.version);
  for (int i = HSIZE; i < (int)sizeof buf; i++)
    if (buf[i] != 0xEE) return failf(c, "v%d listen wrote past the 128-byte handle (byte %d changed)", c->cn.version, i);
  unsigned char all[MAXR][HSIZE];
  if (exchange_handles(c, buf, all)) return -1;
  void* handles[MAXR];
  for (int i = 0; i < c->hc.nranks; i++) handles[i] = all[i];
  void* cc = NULL;
  stagef(c, "v%d connect(handles[%d], rank %d) (one call)", c->cn.version, c->hc.nranks, c->hc.rank);
  int64_t t0 = now_ns();
  r = cn_connect(&c->cn, handles, c->hc.nranks, c->hc.rank, lc, &cc);
  double ms = ms_since(t0);
  if (connect_ms) *connect_ms = ms;
  if (r != ncclSuccess)
    return failf(c, "v%d connect(nranks %d, rank %d) returned %d (%s) after %.0f ms", c->cn.version, c->hc.nranks, c->hc.rank,
                 r, rstr(r), ms);
  if (cc == NULL)
    return failf(c, "v%d connect returned ncclSuccess with a NULL collComm after %.0f ms (NCCL calls connect once: "
                 "CollNet would be disabled)", c->cn.version, ms);
  stagef(c, "v%d closeListen", c->cn.version);
  r = cn_close_listen(&c->cn, lc);
  if (r != ncclSuccess) return failf(c, "v%d closeListen after connect returned %d (%s)", c->cn.version, r, rstr(r));
  *ccout = cc;
  return 0;
}

/* init + devices + getProperties(each, canary) on table version v. */
int cn_init_checked(rctx_t* c, int v, uint64_t commId) {
  char err[256];
  if (cn_bind(&c->cn, c->dl, v, err, sizeof err) != 0) return failf(c, "%s", err);
  stagef(c, "v%d init", v);
  ncclResult_t r = cn_init(&c->cn, commId);
  if (r != ncclSuccess) return failf(c, "%s init returned %d (%s)", cn_symbol_name(v), r, rstr(r));
  r = cn_devices(&c->cn, &c->ndev);
  if (r != ncclSuccess) return failf(c, "v%d devices returned %d (%s)", v, r, rstr(r));
  if (c->ndev < 1) return failf(c, "v%d devices reported %d devices (CollNet would be disabled)", v, c->ndev);
  for (int dev = 0; dev < c->ndev && dev < 4; dev++) {
    _Alignas(16) unsigned char buf[512];
    memset(buf, 0xCD, sizeof buf);
    stagef(c, "v%d getProperties(%d)", v, dev);
    r = cn_get_props_raw(&c->cn, dev, buf);
    if (r != ncclSuccess) return failf(c, "v%d getProperties(%d) returned %d (%s)", v, dev, r, rstr(r));
    if (check_props(c, v, dev, buf, sizeof buf, dev == 0 ? &c->props : NULL)) return -1;
  }
  return 0;
}

uint64_t comm_id(rctx_t* c) { return 0xC011AE70000ULL + (uint64_t)c->hc.nranks * 16 + (uint64_t)c->gen; }

int std_setup(rctx_t* c) {
  if (open_lib(c)) return -1;
  if (cn_init_checked(c, g_version, comm_id(c))) return -1;
  return cn_connect_all(c, 0, &c->cc, NULL);
}

int std_teardown(rctx_t* c) {
  if (c->cc) {
    stagef(c, "closeColl");
    ncclResult_t r = cn_close_coll(&c->cn, c->cc);
    c->cc = NULL;
    if (r != ncclSuccess) return failf(c, "closeColl returned %d (%s)", r, rstr(r));
  }
  stagef(c, "finalize");
  ncclResult_t r = cn_finalize(&c->cn);
  if (r != ncclSuccess) return failf(c, "finalize returned %d (%s)", r, rstr(r));
  if (atomic_load(&cn_logger_bad_calls))
    return failf(c, "the plugin called the logger %ld times with a NULL format or a bad level",
                 (long)atomic_load(&cn_logger_bad_calls));
  return 0;
}

int regmr(rctx_t* c, void* data, size_t size, void** mh, const char* what) {
  stagef(c, "regMr(%s, %zu B)", what, size);
  *mh = NULL;
  ncclResult_t r = cn_regmr(&c->cn, c->cc, data, size, NCCL_PTR_HOST, mh);
  if (r != ncclSuccess) return failf(c, "regMr(%s, %zu B, NCCL_PTR_HOST) returned %d (%s)", what, size, r, rstr(r));
  if (*mh == NULL) return failf(c, "regMr(%s) returned ncclSuccess with a NULL mhandle", what);
  return 0;
}

int deregmr(rctx_t* c, void* mh, const char* what) {
  if (!mh) return 0;
  ncclResult_t r = cn_deregmr(&c->cn, c->cc, mh);
  if (r != ncclSuccess) return failf(c, "deregMr(%s) returned %d (%s)", what, r, rstr(r));
  return 0;
}

/* ---------------------------------------------------------------- operations */

static ncclResult_t cop_post_once(rctx_t* c, cop_t* o, void** req) {
  cn_t* n = o->cn ? o->cn : &c->cn;
  void* cc = o->cn ? o->cc : c->cc;
  switch (o->kind) {
    case K_AR: return cn_iallreduce(n, cc, o->send, o->recv, o->count, o->dt, o->op, o->smh, o->rmh, req);
    case K_AG: return cn_iallgather(n, cc, o->send, 1, &o->part, o->bpr, o->off, o->wb, o->smh, req);
    default: return cn_ireducescatter(n, cc, 1, &o->part, o->recv, o->bpr, o->off, o->wb, o->dt, o->op, o->rmh, req);
  }
}

static int cop_poll(rctx_t* c, cop_t* o) {
  if (!o->posted || o->done) return 0;
  int done = 0, size = -1;
  ncclResult_t r = cn_test(o->cn ? o->cn : &c->cn, o->req, &done, &size);
  if (r != ncclSuccess) return failf(c, "%s: test() returned %d (%s)", o->what, r, rstr(r));
  if (done) {
    o->done = 1;
    o->size = size;
  }
  return 0;
}

/* posts, retrying a NULL request ("would block") while testing `others` */
int cop_post(rctx_t* c, cop_t* o, cop_t** others, int nothers) {
  o->req = NULL;
  o->posted = o->done = 0;
  o->size = -1;
  int64_t deadline = op_deadline(c), t0 = now_ns();
  int spins = 0;
  stagef(c, "post %s", o->what);
  for (;;) {
    void* req = NULL;
    ncclResult_t r = cop_post_once(c, o, &req);
    if (r != ncclSuccess) return failf(c, "%s: post returned %d (%s)", o->what, r, rstr(r));
    if (req) {
      o->req = req;
      o->posted = 1;
      return 0;
    }
    o->nulls++;
    for (int i = 0; i < nothers; i++)
      if (cop_poll(c, others[i])) return -1;
    if (check_abort(c)) return -1;
    if (now_ns() > deadline) return failf(c, "%s: kept returning a NULL request for %.0f ms", o->what, ms_since(t0));
    backoff(&spins);
  }
}

int cop_wait(rctx_t* c, cop_t** ops, int n) {
  int64_t deadline = op_deadline(c), t0 = now_ns();
  int spins = 0;
  stagef(c, "waiting for %d request(s), first %s", n, ops[0]->what);
  for (;;) {
    int left = 0;
    for (int i = 0; i < n; i++) {
      if (cop_poll(c, ops[i])) return -1;
      if (!ops[i]->done) left++;
    }
    if (!left) return 0;
    if (check_abort(c)) return -1;
    if (now_ns() > deadline) {
      for (int i = 0; i < n; i++)
        if (!ops[i]->done)
          return failf(c, "%s: not done after %.0f ms of test() polling (%d of %d requests pending)", ops[i]->what,
                       ms_since(t0), left, n);
    }
    backoff(&spins);
  }
}

int cop_run(rctx_t* c, cop_t* o) {
  if (cop_post(c, o, NULL, 0)) return -1;
  cop_t* ops[1] = {o};
  return cop_wait(c, ops, 1);
}
