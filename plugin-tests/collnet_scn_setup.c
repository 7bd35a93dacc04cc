/*
 * collnet_scn_setup.c: the collnet_harness scenarios about the tables themselves: symbols (every
 * version resolves, its members, init/devices/getProperties, connect), support (reduceSupport for
 * every type and op, regMr, regMrDmaBuf refused) and versions (collectives through each
 * version's own table).
 */
#include "collnet_harness.h"

/* ================================================================= scenarios */

/* ---------------------------------------------------------------- symbols */

int scn_symbols(rctx_t* c) {
  if (open_lib(c)) return -1;
  char notes[DETAIL_LEN] = "";
  for (int v = NET_MIN_VERSION; v <= NET_MAX_VERSION; v++) {
    cn_t t;
    char err[256], nulls[256], opt[256];
    if (cn_bind(&t, c->dl, v, err, sizeof err) != 0) return failf(c, "%s", err);
    /* the table is a data symbol of exactly the struct's size */
    Dl_info info;
    const ElfW(Sym)* sym = NULL;
    if (dladdr1(t.table, &info, (void**)&sym, RTLD_DL_SYMENT) && sym) {
      if (ELF64_ST_TYPE(sym->st_info) != STT_OBJECT)
        return failf(c, "%s is not a data symbol (ELF type %d)", cn_symbol_name(v), (int)ELF64_ST_TYPE(sym->st_info));
      if (sym->st_size != 0 && sym->st_size != cn_table_size(v))
        return failf(c, "%s: ELF symbol size %zu, sizeof(ncclCollNet_v%d_t) is %zu", cn_symbol_name(v),
                     (size_t)sym->st_size, v, cn_table_size(v));
    }
    const char* name = *(const char* const*)t.table;
    if (name == NULL || strnlen(name, 64) == 0 || strnlen(name, 64) >= 64)
      return failf(c, "%s.name is NULL, empty or unterminated", cn_symbol_name(v));
    if (cn_null_members(&t, nulls, sizeof nulls, opt, sizeof opt))
      return failf(c, "%s: NULL members: %s", cn_symbol_name(v), nulls);
    if (opt[0] && v == NET_MAX_VERSION)
      snprintf(notes + strlen(notes), sizeof notes - strlen(notes), "v%d NULL (optional): %s; ", v, opt);
    if (v == NET_MAX_VERSION)
      snprintf(notes + strlen(notes), sizeof notes - strlen(notes), "name \"%s\"; ", name);
    /* init / devices / getProperties / finalize through this version's table */
    if (cn_init_checked(c, v, 0xC0115ULL + (uint64_t)v)) return -1;
    if (v == NET_MAX_VERSION)
      snprintf(notes + strlen(notes), sizeof notes - strlen(notes), "%d dev(s), dev0 \"%s\" speed %d maxCollBytes %zu; ",
               c->ndev, c->props.name, c->props.speed, c->props.maxCollBytes);
    ncclResult_t r = cn_finalize(&c->cn);
    if (r != ncclSuccess) return failf(c, "v%d finalize returned %d (%s)", v, r, rstr(r));
  }
  /* and a real connect through the selected version */
  if (cn_init_checked(c, g_version, comm_id(c))) return -1;
  double ms = 0;
  if (cn_connect_all(c, 0, &c->cc, &ms)) return -1;
  if (std_teardown(c)) return -1;
  if (c->hc.rank == 0) detailf(c, "%sv%d connect %.0f ms", notes, g_version, ms);
  return 0;
}

/* ---------------------------------------------------------------- support */

int scn_support(rctx_t* c) {
  if (std_setup(c)) return -1;
  int m[12][4];
  char bad[512] = "";
  for (int t = 0; t < 12; t++)
    for (int o = 0; o < 4; o++) {
      int s = -7;
      ncclResult_t r = cn_reduce_support(&c->cn, t, o, &s);
      m[t][o] = r != ncclSuccess ? -100 - (int)r : s;
      if (r != ncclSuccess || s != 1)
        snprintf(bad + strlen(bad), sizeof bad - strlen(bad), " %s/%s=%s%d", tname(t), oname(o),
                 r != ncclSuccess ? "err" : "", r != ncclSuccess ? (int)r : s);
    }
  /* beyond the matrix NCCL asks about: must not claim support (0) or return an error */
  struct {
    int t, o;
  } extra[] = {{7, 4}, {2, 4}, {7, 5}, {0, 9}, {12, 0}, {13, 2}, {7, 100}, {100, 0}};
  char ext[512] = "";
  for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
    int s = -7;
    ncclResult_t r = cn_reduce_support(&c->cn, extra[i].t, extra[i].o, &s);
    snprintf(ext + strlen(ext), sizeof ext - strlen(ext), " (type %d, op %d)=%s%d", extra[i].t, extra[i].o,
             r != ncclSuccess ? "err " : "", r != ncclSuccess ? (int)r : s);
    if (r == ncclSuccess && s != 0)
      snprintf(bad + strlen(bad), sizeof bad - strlen(bad), " (type %d, op %d) supported=%d (expected 0 or an error)",
               extra[i].t, extra[i].o, s);
  }
  if (c->hc.rank == 0 && g_print_matrix) {
    printf("  reduceSupport matrix (v%d; 1 = supported, 0 = not, eN = error N):\n  %6s", g_version, "");
    for (int o = 0; o < 4; o++) printf(" %5s", oname(o));
    printf("\n");
    for (int t = 0; t < 12; t++) {
      printf("  %6s", tname(t));
      for (int o = 0; o < 4; o++) {
        if (m[t][o] <= -100) printf("    e%d", -(m[t][o] + 100));
        else printf(" %5d", m[t][o]);
      }
      printf("\n");
    }
    printf("  beyond:%s\n", ext);
    fflush(stdout);
  }
  if (bad[0]) return failf(c, "reduceSupport:%s", bad);

  /* registration: regMr/deregMr of a host buffer, regMrDmaBuf must fail */
  gbuf_t b = {0};
  if (gbuf_alloc(c, &b, MIB, "regmr buffer")) return -1;
  void* mh = NULL;
  if (regmr(c, b.p, MIB, &mh, "1 MiB host buffer") || deregmr(c, mh, "1 MiB host buffer")) return -1;
  void* mh2 = NULL;
  if (regmr(c, b.p + 4096, 8192, &mh, "sub-range a") || regmr(c, b.p + 4096, 8192, &mh2, "sub-range b (same range)"))
    return -1;
  if (deregmr(c, mh, "sub-range a") || deregmr(c, mh2, "sub-range b")) return -1;
  int fd = open("/dev/null", O_RDONLY);
  void* dmh = NULL;
  stagef(c, "regMrDmaBuf");
  ncclResult_t dr = cn_regmr_dmabuf(&c->cn, c->cc, b.p, MIB, NCCL_PTR_CUDA, 0, fd, &dmh);
  if (fd >= 0) close(fd);
  if (dr == ncclSuccess) return failf(c, "regMrDmaBuf(NCCL_PTR_CUDA, fd of /dev/null) returned ncclSuccess (mhandle %p)", dmh);
  /* iflush: NCCL calls it only for GDR; report what it does */
  void* freq = (void*)0x1;
  ncclResult_t r = cn_iflush(&c->cn, c->cc, b.p, 4096, NULL, &freq);
  char fl[96];
  snprintf(fl, sizeof fl, "iflush: %d (%s), request %s", r, rstr(r), freq == NULL ? "NULL" : freq == (void*)0x1 ? "unwritten" : "set");
  if (r == ncclSuccess && freq != NULL && freq != (void*)0x1) {
    int done = 0, s = 0;
    int64_t dl = op_deadline(c);
    int spins = 0;
    while (!done) {
      ncclResult_t tr = cn_test(&c->cn, freq, &done, &s);
      if (tr != ncclSuccess) return failf(c, "test() of an iflush request returned %d (%s)", tr, rstr(tr));
      if (now_ns() > dl) return failf(c, "iflush request never completed");
      backoff(&spins);
    }
  }
  gbuf_free(&b);
  if (sync_ranks(c, "support done")) return -1;
  if (std_teardown(c)) return -1;
  if (c->hc.rank == 0) detailf(c, "12x4 all supported; regMrDmaBuf -> %d (%s); %s", dr, rstr(dr), fl);
  return 0;
}

/* ---------------------------------------------------------------- versions */

int scn_versions(rctx_t* c) {
  if (open_lib(c)) return -1;
  char det[DETAIL_LEN] = "";
  for (int v = NET_MIN_VERSION; v <= NET_MAX_VERSION; v++) {
    if (cn_init_checked(c, v, comm_id(c) + 0x100 * (uint64_t)v)) return -1;
    double cms = 0;
    if (cn_connect_all(c, 0, &c->cc, &cms)) return -1;
    /* allreduce int32 sum, 1000 elements, through this version's own iallreduce (int count for v6-v8) */
    const size_t count = 1000 + (size_t)v;
    gbuf_t sb = {0}, rb = {0};
    if (gbuf_alloc(c, &sb, count * 4, "send") || gbuf_alloc(c, &rb, count * 4, "recv")) return -1;
    void *smh, *rmh;
    if (regmr(c, sb.p, count * 4, &smh, "send") || regmr(c, rb.p, count * 4, &rmh, "recv")) return -1;
    uint64_t seeds[MAXR] = {0};
    for (int r = 0; r < c->hc.nranks; r++) seeds[r] = seed_of((uint64_t)r, 0x7E5, (uint64_t)v);
    gen_buf(2, 0, MODE_EXACT, seeds[c->hc.rank], count, sb.p);
    gbuf_arm(&rb, 0, count * 4, 0x5A);
    cop_t o;
    memset(&o, 0, sizeof o);
    o.kind = K_AR;
    o.send = sb.p;
    o.recv = rb.p;
    o.count = count;
    o.dt = 2;
    o.op = 0;
    o.smh = smh;
    o.rmh = rmh;
    snprintf(o.what, sizeof o.what, "v%d iallreduce(int32 sum, count %zu)", v, count);
    if (cop_run(c, &o)) return -1;
    if (o.size != (int)(count * 4)) return failf(c, "%s: test() size %d, expected %zu", o.what, o.size, count * 4);
    unsigned char* scratch = malloc(count * 4 * (size_t)c->hc.nranks);
    char msg[256] = "";
    if (!scratch) return failf(c, "out of memory");
    size_t bad = check_reduction(2, 0, MODE_EXACT, c->hc.nranks, seeds, count, rb.p, scratch, msg, sizeof msg);
    free(scratch);
    if (bad) return failf(c, "%s: %zu elements wrong; first: %s", o.what, bad, msg);
    if (gbuf_guard_bad(&rb, 0, count * 4) >= 0) return failf(c, "%s: written outside the recv buffer", o.what);
    if (v >= 8) {
      /* allgather of 100 bytes per rank and a float reducescatter, whole window, this version's SGE */
      size_t bpr = 100, total = bpr * (size_t)c->hc.nranks;
      gbuf_t ab = {0};
      if (gbuf_alloc(c, &ab, total, "allgather")) return -1;
      void* amh;
      if (regmr(c, ab.p, total, &amh, "allgather")) return -1;
      pat_fill(sb.p, bpr, seeds[c->hc.rank]);
      memset(&o, 0, sizeof o);
      o.kind = K_AG;
      o.send = sb.p;
      o.smh = smh;
      o.part.mhandle = amh;
      o.part.address = ab.p;
      o.part.size = total;
      o.bpr = bpr;
      o.off = 0;
      o.wb = total;
      snprintf(o.what, sizeof o.what, "v%d iallgather(bytesPerRank %zu, whole window)", v, bpr);
      gbuf_arm(&ab, 0, total, 0x5A);
      if (cop_run(c, &o)) return -1;
      for (size_t j = 0; j < total; j++)
        if (ab.p[j] != pat_byte(seeds[j / bpr], j % bpr))
          return failf(c, "%s: byte %zu is 0x%02x, expected 0x%02x", o.what, j, ab.p[j], pat_byte(seeds[j / bpr], j % bpr));
      if (gbuf_guard_bad(&ab, 0, total) >= 0) return failf(c, "%s: written outside the window", o.what);
      /* reducescatter: float sum; rank r's input element j = r + 1 + j  */
      size_t pe = 64, ptot = pe * (size_t)c->hc.nranks;
      float* fin = (float*)sb.p;
      if (ptot > count) return failf(c, "internal: versions buffer too small");
      for (size_t j = 0; j < ptot; j++) fin[j] = (float)(c->hc.rank + 1) + (float)j;
      gbuf_arm(&rb, 0, pe * 4, CANARY);
      memset(&o, 0, sizeof o);
      o.kind = K_RS;
      o.part.mhandle = smh;
      o.part.address = fin;
      o.part.size = ptot * 4;
      o.recv = rb.p;
      o.rmh = rmh;
      o.dt = 7;
      o.op = 0;
      o.bpr = pe * 4;
      o.off = 0;
      o.wb = ptot * 4;
      snprintf(o.what, sizeof o.what, "v%d ireducescatter(float sum, bytesPerRank %zu, whole window)", v, pe * 4);
      if (cop_run(c, &o)) return -1;
      const float* out = (const float*)rb.p;
      float base = (float)(c->hc.nranks * (c->hc.nranks + 1) / 2);
      for (size_t j = 0; j < pe; j++) {
        float want = base + (float)c->hc.nranks * (float)((size_t)c->hc.rank * pe + j);
        if (out[j] != want) return failf(c, "%s: element %zu is %g, expected %g", o.what, j, (double)out[j], (double)want);
      }
      if (gbuf_guard_bad(&rb, 0, pe * 4) >= 0) return failf(c, "%s: written outside the own slice", o.what);
      if (deregmr(c, amh, "allgather")) return -1;
      gbuf_free(&ab);
    }
    if (deregmr(c, smh, "send") || deregmr(c, rmh, "recv")) return -1;
    gbuf_free(&sb);
    gbuf_free(&rb);
    if (sync_ranks(c, "version done")) return -1;
    if (std_teardown(c)) return -1;
    snprintf(det + strlen(det), sizeof det - strlen(det), "v%d ok (connect %.0f ms%s); ", v, cms,
             v >= 8 ? ", ag+rs" : "");
  }
  size_t dl = strlen(det);
  if (dl >= 2) det[dl - 2] = 0; /* trailing "; " */
  if (c->hc.rank == 0) detailf(c, "%s", det);
  return 0;
}
