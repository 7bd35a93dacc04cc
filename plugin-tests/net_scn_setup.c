/*
 * net_scn_setup.c: the net_harness scenarios about loading and connecting: symbols (every
 * ncclNetPlugin_v6..v12 table, its members and properties), connect2 and connect1 (connection
 * setup across and within a process), cycles (connection churn; fd and RSS growth), versions
 * (traffic through each table version) and reload (dlopen/dlclose cycles).
 */
#include "net_harness.h"

/* ---------------------------------------------------------------------------------- symbols */

static void check_members(net_t* n, errs_t* e) {
  int v = n->version;
#define REQ(t, m) \
  if (!(t)->m) add_err(e, "v%d: member %s is NULL", v, #m)
#define REQ_ALL(t)         \
  do {                     \
    REQ(t, init);          \
    REQ(t, devices);       \
    REQ(t, getProperties); \
    REQ(t, listen);        \
    REQ(t, connect);       \
    REQ(t, accept);        \
    REQ(t, regMr);         \
    REQ(t, regMrDmaBuf);   \
    REQ(t, deregMr);       \
    REQ(t, isend);         \
    REQ(t, irecv);         \
    REQ(t, iflush);        \
    REQ(t, test);          \
    REQ(t, closeSend);     \
    REQ(t, closeRecv);     \
    REQ(t, closeListen);   \
  } while (0)
  switch (v) {
    case 6: REQ_ALL(n->t6); break;
    case 7: REQ_ALL(n->t7); break;
    case 8: REQ_ALL(n->t8); break;
    case 9: REQ_ALL(n->t9); break;
    case 10: REQ_ALL(n->t10); break;
    case 11: REQ_ALL(n->t11); REQ(n->t11, finalize); break;
    case 12: REQ_ALL(n->t12); REQ(n->t12, finalize); break;
  }
#undef REQ_ALL
#undef REQ
}

static void check_props(int v, int dev, int ndev, const net_props_t* p, errs_t* e) {
  if (p->name == NULL) add_err(e, "v%d dev %d: name is NULL", v, dev);
  else if (strnlen(p->name, 256) == 0 || strnlen(p->name, 256) >= 256)
    add_err(e, "v%d dev %d: name is empty or not terminated", v, dev);
  if (!(p->ptrSupport & NCCL_PTR_HOST)) add_err(e, "v%d dev %d: ptrSupport 0x%x lacks NCCL_PTR_HOST", v, dev, p->ptrSupport);
  if (p->ptrSupport & (NCCL_PTR_CUDA | NCCL_PTR_DMABUF))
    add_err(e, "v%d dev %d: ptrSupport 0x%x advertises CUDA/DMABUF (host-only plugin)", v, dev, p->ptrSupport);
  if (p->speed <= 0) add_err(e, "v%d dev %d: speed %d <= 0", v, dev, p->speed);
  if (!(p->latency >= 0.0f) || isinf(p->latency)) add_err(e, "v%d dev %d: latency %g invalid", v, dev, (double)p->latency);
  if (p->maxComms <= 0) add_err(e, "v%d dev %d: maxComms %d <= 0", v, dev, p->maxComms);
  if (v == 6) {
    if (p->maxRecvs < 1 || p->maxRecvs > NCCL_NET_MAX_REQUESTS_V6)
      add_err(e, "v6 dev %d: maxRecvs %d not in [1, 8]", dev, p->maxRecvs);
  } else if (p->maxRecvs != 8) {
    add_err(e, "v%d dev %d: maxRecvs %d, expected 8", v, dev, p->maxRecvs);
  }
  if (v >= 7) {
    if (p->netDeviceType != NCCL_NET_DEVICE_HOST) add_err(e, "v%d dev %d: netDeviceType %d, expected HOST (0)", v, dev, p->netDeviceType);
    if (p->netDeviceVersion != 0) add_err(e, "v%d dev %d: netDeviceVersion %d, expected 0", v, dev, p->netDeviceVersion);
  }
  if (v >= 8 && p->regIsGlobal != 0 && p->regIsGlobal != 1)
    add_err(e, "v%d dev %d: regIsGlobal %d not 0/1", v, dev, p->regIsGlobal);
  if (v >= 9) {
    if (p->forceFlush != 0 && p->forceFlush != 1) add_err(e, "v%d dev %d: forceFlush %d not 0/1", v, dev, p->forceFlush);
    if (p->maxP2pBytes == 0 || p->maxP2pBytes > NCCL_MAX_NET_SIZE_BYTES)
      add_err(e, "v%d dev %d: maxP2pBytes %zu not in (0, 1 TiB]", v, dev, p->maxP2pBytes);
    if (p->maxCollBytes == 0 || p->maxCollBytes > NCCL_MAX_NET_SIZE_BYTES)
      add_err(e, "v%d dev %d: maxCollBytes %zu not in (0, 1 TiB]", v, dev, p->maxCollBytes);
    int maxv = v >= 12 ? NCCL_NET_MAX_DEVS_PER_NIC_V12 : NCCL_NET_MAX_DEVS_PER_NIC_V9;
    if (p->vndevs < 0 || p->vndevs > maxv) add_err(e, "v%d dev %d: vProps.ndevs %d not in [0, %d]", v, dev, p->vndevs, maxv);
    else
      for (int i = 0; i < p->vndevs; i++)
        if (p->vdevs[i] < 0 || p->vdevs[i] >= ndev)
          add_err(e, "v%d dev %d: vProps.devs[%d] = %d not a device index", v, dev, i, p->vdevs[i]);
  }
  if (v >= 11 && p->maxMultiRequestSize < 1)
    add_err(e, "v%d dev %d: maxMultiRequestSize %d < 1", v, dev, p->maxMultiRequestSize);
  if (v >= 11 && g_expect_multi > 0 && p->maxMultiRequestSize != g_expect_multi)
    add_err(e, "v%d dev %d: maxMultiRequestSize %d, expected %d (--expect-multi)", v, dev, p->maxMultiRequestSize,
            g_expect_multi);
  if (v >= 12) {
    /* Nothing fabricoll can read names a rail or a plane: both must be NCCL_NET_ID_UNDEF. */
    if (p->railId != -1) add_err(e, "v12 dev %d: railId %d, expected -1 (undefined)", dev, p->railId);
    if (p->planeId != -1) add_err(e, "v12 dev %d: planeId %d, expected -1 (undefined)", dev, p->planeId);
  }
}

int scn_symbols(rctx_t* c) {
  errs_t e = {{0}, 0};
  stagef(c, "dlopen %s", g_lib);
  dlerror();
  void* dl = dlopen(g_lib, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    const char* de = dlerror();
    return failf(c, "dlopen(%s) failed: %s", g_lib, de ? de : "?");
  }
  net_props_t ref;
  memset(&ref, 0, sizeof ref);
  int have_ref = 0, ndev0 = 0, setattr_null = 0;
  char names[64] = "";
  for (int v = NET_MIN_VERSION; v <= NET_MAX_VERSION; v++) {
    net_t n;
    char err[512];
    stagef(c, "dlsym %s", net_symbol_name(v));
    if (net_bind(&n, dl, v, err, sizeof err) != 0) {
      add_err(&e, "%s", err);
      continue;
    }
    const char* name = *(const char* const*)n.table; /* member 1 of every version */
    if (name == NULL || strcmp(name, "fabricoll") != 0)
      add_err(&e, "%s.name is \"%s\", expected \"fabricoll\"", net_symbol_name(v), name ? name : "(null)");
    int before = e.count;
    check_members(&n, &e);
    if (e.count != before) continue;
    stagef(c, "v%d init", v);
    ncclResult_t r = net_init(&n, 0xfab0c000ULL + (uint64_t)v);
    if (r != ncclSuccess) {
      add_err(&e, "v%d init returned %d (%s)", v, r, rstr(r));
      continue;
    }
    if (v >= 11 && n.ctx == NULL) vlog("v%d init left ctx NULL (allowed)\n", v);
    int ndev = -1;
    stagef(c, "v%d devices", v);
    r = net_devices(&n, &ndev);
    if (r != ncclSuccess || ndev < 1) {
      add_err(&e, "v%d devices returned %d (%s), ndev %d", v, r, rstr(r), ndev);
    } else {
      if (v == NET_MAX_VERSION) ndev0 = ndev;
      for (int dev = 0; dev < ndev && dev < 4; dev++) {
        _Alignas(16) unsigned char buf[512];
        memset(buf, 0xCD, sizeof buf);
        stagef(c, "v%d getProperties(%d)", v, dev);
        r = net_get_props_raw(&n, dev, buf);
        if (r != ncclSuccess) {
          add_err(&e, "v%d getProperties(%d) returned %d (%s)", v, dev, r, rstr(r));
          continue;
        }
        size_t sz = net_props_size(v);
        for (size_t i = sz; i < sizeof buf; i++)
          if (buf[i] != 0xCD) {
            add_err(&e, "v%d getProperties(%d) wrote past sizeof(ncclNetProperties_v%d_t) = %zu (byte %zu changed)", v,
                    dev, v, sz, i);
            break;
          }
        net_props_t p;
        net_props_decode(v, buf, &p);
        check_props(v, dev, ndev, &p, &e);
        if (dev == 0) {
          if (!have_ref) {
            ref = p;
            have_ref = 1;
          } else {
            if (p.name && ref.name && strcmp(p.name, ref.name) != 0)
              add_err(&e, "v%d dev 0 name \"%s\" differs from v6's \"%s\"", v, p.name, ref.name);
            if (p.speed != ref.speed) add_err(&e, "v%d dev 0 speed %d differs from v6's %d", v, p.speed, ref.speed);
            if (p.guid != ref.guid) add_err(&e, "v%d dev 0 guid differs from v6's", v);
          }
        }
      }
    }
    if (v >= 11) {
      ncclResult_t (*setNetAttr)(void*, ncclNetAttr_v11_t*) = v == 11 ? n.t11->setNetAttr : n.t12->setNetAttr;
      if (setNetAttr) {
        ncclNetAttr_v11_t attr;
        memset(&attr, 0, sizeof attr);
        attr.sendCommAttr.maxConcurrentPeers = attr.recvCommAttr.maxConcurrentPeers = 8;
        attr.sendCommAttr.minConcurrentPeers = attr.recvCommAttr.minConcurrentPeers = 1;
        attr.sendCommAttr.maxFlowsPerPeer = attr.recvCommAttr.maxFlowsPerPeer = 2;
        attr.sendCommAttr.minFlowsPerPeer = attr.recvCommAttr.minFlowsPerPeer = 1;
        attr.op = 1u << 4; /* AllReduce */
        attr.algo = 1u << 1; /* RING */
        attr.proto = 1u << 2; /* SIMPLE */
        stagef(c, "v%d setNetAttr", v);
        r = setNetAttr(n.ctx, &attr);
        if (r != ncclSuccess) add_err(&e, "v%d setNetAttr (a hint) returned %d (%s)", v, r, rstr(r));
      } else {
        setattr_null++;
      }
      /* a second communicator's context alongside the first, as NCCL does per comm */
      net_t n2 = n;
      n2.ctx = NULL;
      n2.initialized = 0;
      stagef(c, "v%d second init (another commId)", v);
      r = net_init(&n2, 0xfab0d000ULL + (uint64_t)v);
      if (r != ncclSuccess) {
        add_err(&e, "v%d second init (another communicator) returned %d (%s)", v, r, rstr(r));
      } else {
        stagef(c, "v%d finalize second ctx", v);
        r = net_finalize(&n2);
        if (r != ncclSuccess) add_err(&e, "v%d finalize(second ctx) returned %d (%s)", v, r, rstr(r));
      }
    }
    stagef(c, "v%d finalize", v);
    r = net_finalize(&n);
    if (r != ncclSuccess) add_err(&e, "v%d finalize returned %d (%s)", v, r, rstr(r));
    snprintf(names + strlen(names), sizeof names - strlen(names), "%sv%d", names[0] ? "," : "", v);
  }
  long bad = atomic_load(&net_logger_bad_calls);
  if (bad) add_err(&e, "the plugin called the logger %ld times with a NULL format or a bad level", bad);
  if (e.count) return failf(c, "%d problems: %s", e.count, e.text);
  if (have_ref)
    detailf(c, "%s ok; ndev=%d; dev0 \"%s\" speed %d Mbps latency %.1f us maxComms %d maxRecvs %d ptrSupport 0x%x%s; "
               "logger calls %ld%s",
            names, ndev0, ref.name ? ref.name : "?", ref.speed, (double)ref.latency, ref.maxComms, ref.maxRecvs,
            ref.ptrSupport, ref.pciPath ? "" : " pciPath NULL", atomic_load(&net_logger_calls),
            setattr_null ? "; setNetAttr NULL" : "");
  return 0;
}

/* ---------------------------------------------------------------------------------- connect2 */

int scn_connect2(rctx_t* c) {
  if (std_setup(c, 0xc0002)) return -1;
  void *sc = NULL, *rc = NULL;
  int64_t t0 = now_ns();
  if (pair_one_way(c, &sc, &rc, 0, 1, "connect2")) return -1;
  double ms = ms_since(t0);
  if (sync_ranks(c, "connected")) return -1;
  if (c->hc.rank == 0 && close_send(c, sc, "connect2")) return -1;
  if (c->hc.rank == 1 && close_recv(c, rc, "connect2")) return -1;
  if (sync_ranks(c, "closed")) return -1;
  if (std_teardown(c)) return -1;
  detailf(c, "%s in %.1f ms", c->hc.rank == 0 ? "connect" : "accept", ms);
  return 0;
}

/* ---------------------------------------------------------------------------------- connect1 */

int scn_connect1(rctx_t* c) {
  if (std_setup(c, 0xc0001)) return -1;
  c->net.devcomm_null = 1; /* NCCL's GDR probe passes NULL devComm pointers */
  unsigned char h[2][HSIZE];
  void *lc[2], *sc[2], *rc[2];
  if (do_listen(c, h[0], &lc[0]) || do_listen(c, h[1], &lc[1])) return -1;
  int64_t t0 = now_ns();
  if (establish(c, 2, h, sc, 2, lc, rc, "connect1 (one thread, connect/accept alternately)")) return -1;
  double ms = ms_since(t0);
  const size_t size = MIB;
  unsigned char *sb[2], *rb[2];
  void *smh[2], *rmh[2];
  for (int i = 0; i < 2; i++) {
    sb[i] = xalloc(c, size, "send buffer");
    rb[i] = xalloc(c, size + 64, "recv buffer");
    if (!sb[i] || !rb[i]) return -1;
    if (regmr(c, sc[i], sb[i], size, &smh[i], "connect1") || regmr(c, rc[i], rb[i], size + 64, &rmh[i], "connect1"))
      return -1;
  }
  for (int i = 0; i < 2; i++) {
    char what[64];
    snprintf(what, sizeof what, "connect1 1 MiB over loopback pair %d", i);
    uint64_t seed = seed_of(1, (uint64_t)i, size);
    pat_fill(sb[i], size, seed);
    side_t s = {sc[i], smh[i], sb[i], size, 0, 0, 7};
    side_t r = {rc[i], rmh[i], rb[i], size, size + 64, seed, 7};
    if (xfer_step(c, &s, &r, 0, what)) return -1;
  }
  for (int i = 0; i < 2; i++) {
    if (deregmr(c, sc[i], smh[i], "connect1") || deregmr(c, rc[i], rmh[i], "connect1")) return -1;
    if (close_send(c, sc[i], "connect1") || close_recv(c, rc[i], "connect1")) return -1;
    free(sb[i]);
    free(rb[i]);
  }
  if (std_teardown(c)) return -1;
  detailf(c, "2 loopback pairs in one thread in %.1f ms, 1 MiB verified on each", ms);
  return 0;
}

/* -------------------------------------------------------------------------------------- cycles */

int scn_cycles(rctx_t* c) {
  if (std_setup(c, 0xc000a)) return -1;
  const size_t sz = 1024;
  unsigned char* sb = xalloc(c, sz, "cycles buffer");
  unsigned char* rb = xalloc(c, sz + 64, "cycles buffer");
  if (!sb || !rb) return -1;
  int ncyc = g_cycles;
  int mark = ncyc >= 200 ? 100 : (ncyc / 10 > 0 ? ncyc / 10 : 1);
  /* RSS is read after cycle `mark`, after the middle cycle and at the end. A leak grows RSS in
   * both halves; a pool that the provider maps at start and touches all at once later (ofi_rxm
   * on tcp: a one-time step of ~16.6 MiB seen in about 1 run in 4, the same after 4,000 cycles
   * as after 1,000) grows it in one half only. */
  int mid = mark + (ncyc - mark) / 2;
  hc_growth_t g;
  hc_growth_init(&g, mark, mid, ncyc);
  int64_t t0 = now_ns();
  for (int cyc = 0; cyc < ncyc; cyc++) {
    char what[64];
    snprintf(what, sizeof what, "cycle %d", cyc);
    void *sc = NULL, *rc = NULL, *mh = NULL;
    if (pair_one_way(c, &sc, &rc, 0, (unsigned)cyc + 1, what)) return -1;
    uint64_t seed = seed_of(cyc, 10, 10);
    if (c->hc.rank == 0) {
      if (regmr(c, sc, sb, sz, &mh, what)) return -1;
      pat_fill(sb, sz, seed);
      side_t s = {sc, mh, sb, sz, 0, 0, 1};
      if (xfer_step(c, &s, NULL, 0, what)) return -1;
      if (deregmr(c, sc, mh, what)) return -1;
    } else {
      if (regmr(c, rc, rb, sz + 64, &mh, what)) return -1;
      side_t r = {rc, mh, rb, sz, sz + 64, seed, 1};
      if (xfer_step(c, NULL, &r, 0, what)) return -1;
      if (deregmr(c, rc, mh, what)) return -1;
    }
    if (sync_ranks(c, what)) return -1;
    if (c->hc.rank == 0 && close_send(c, sc, what)) return -1;
    if (c->hc.rank == 1 && close_recv(c, rc, what)) return -1;
    hc_growth_sample(&g, cyc + 1);
  }
  double secs = ms_since(t0) / 1000;
  free(sb);
  free(rb);
  if (std_teardown(c)) return -1;
  atomic_store(&c->shm->val[c->hc.rank][0], (long long)(secs * 1000));
  return check_growth(c, &g);
}

/* ------------------------------------------------------------------------------------ versions */

int scn_versions(rctx_t* c) {
  char err[512], ok[64] = "";
  stagef(c, "dlopen %s", g_lib);
  dlerror();
  void* dl = dlopen(g_lib, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    const char* de = dlerror();
    return failf(c, "dlopen(%s) failed: %s", g_lib, de ? de : "?");
  }
  const size_t size = 64 * 1024;
  unsigned char* sb = xalloc(c, size, "versions send buffer");
  unsigned char* rb = xalloc(c, size + 64, "versions recv buffer");
  if (!sb || !rb) return -1;
  for (int v = NET_MIN_VERSION; v <= NET_MAX_VERSION; v++) {
    char what[64];
    snprintf(what, sizeof what, "v%d", v);
    if (net_bind(&c->net, dl, v, err, sizeof err) != 0) return failf(c, "%s: %s", what, err);
    stagef(c, "%s init", what);
    ncclResult_t r = net_init(&c->net, 0xc000b00ULL + (uint64_t)v);
    if (r != ncclSuccess) return failf(c, "%s init returned %d (%s)", what, r, rstr(r));
    r = net_devices(&c->net, &c->ndev);
    if (r != ncclSuccess || c->ndev < 1) return failf(c, "%s devices returned %d, ndev %d", what, r, c->ndev);
    r = net_get_props(&c->net, 0, &c->props);
    if (r != ncclSuccess) return failf(c, "%s getProperties returned %d (%s)", what, r, rstr(r));
    void *sc, *rc, *smh, *rmh;
    if (pair_both_ways(c, &sc, &rc, 2 * v, 1, what)) return -1;
    if (regmr(c, sc, sb, size, &smh, what) || regmr(c, rc, rb, size + 64, &rmh, what)) return -1;
    uint64_t sseed = seed_of(v, c->hc.rank, 64), rseed = seed_of(v, 1 - c->hc.rank, 64);
    pat_fill(sb, size, sseed);
    side_t s = {sc, smh, sb, size, 0, 0, 20 + c->hc.rank};
    side_t rr = {rc, rmh, rb, size, size + 64, rseed, 20 + (1 - c->hc.rank)};
    if (xfer_step(c, &s, &rr, 0, what)) return -1;
    if (sync_ranks(c, what)) return -1;
    if (deregmr(c, sc, smh, what) || deregmr(c, rc, rmh, what)) return -1;
    if (close_send(c, sc, what) || close_recv(c, rc, what)) return -1;
    stagef(c, "%s finalize", what);
    r = net_finalize(&c->net);
    if (r != ncclSuccess) return failf(c, "%s finalize returned %d (%s)", what, r, rstr(r));
    snprintf(ok + strlen(ok), sizeof ok - strlen(ok), "%sv%d", ok[0] ? "," : "", v);
  }
  free(sb);
  free(rb);
  detailf(c, "%s: connect + 64 KiB each way through each table", ok);
  return 0;
}

/* --------------------------------------------------------------------------------------- reload */

int scn_reload(rctx_t* c) {
  const int iters = 3;
  const size_t size = 64 * 1024;
  unsigned char* sb = xalloc(c, size, "reload buffer");
  unsigned char* rb = xalloc(c, size + 64, "reload buffer");
  if (!sb || !rb) return -1;
  for (int it = 0; it < iters; it++) {
    char what[64];
    snprintf(what, sizeof what, "reload iteration %d", it);
    if (std_setup(c, 0xc000c + (uint64_t)it)) return -1;
    void *sc, *rc, *smh, *rmh;
    if (pair_loopback(c, &sc, &rc, what)) return -1;
    if (regmr(c, sc, sb, size, &smh, what) || regmr(c, rc, rb, size + 64, &rmh, what)) return -1;
    uint64_t seed = seed_of(it, 12, 12);
    pat_fill(sb, size, seed);
    side_t s = {sc, smh, sb, size, 0, 0, 1};
    side_t r = {rc, rmh, rb, size, size + 64, seed, 1};
    if (xfer_step(c, &s, &r, 0, what)) return -1;
    if (deregmr(c, sc, smh, what) || deregmr(c, rc, rmh, what)) return -1;
    if (close_send(c, sc, what) || close_recv(c, rc, what)) return -1;
    if (std_teardown(c)) return -1;
    stagef(c, "%s: dlclose", what);
    net_dlclose(&c->net);
    struct timespec ts = {0, 50 * 1000 * 1000}; /* let any leftover plugin thread run (and crash, if it would) */
    nanosleep(&ts, NULL);
  }
  free(sb);
  free(rb);
  detailf(c, "%d x (dlopen, init, loopback 64 KiB, close, finalize, dlclose)", iters);
  return 0;
}

/* ============================================================================ parent / runner */
