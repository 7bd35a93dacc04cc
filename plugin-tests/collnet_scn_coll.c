/*
 * collnet_scn_coll.c: the collnet_harness scenarios that check the results of the collectives:
 * allreduce (every type and op, several counts, in place; exact and bit-identical across ranks),
 * allgather and reducescatter (whole buffers, then unaligned windows covering them).
 */
#include "collnet_harness.h"

/* ---------------------------------------------------------------- allreduce */

typedef struct {
  int dt, op, mode, inplace;
  size_t count;
} arcase_t;

static int build_ar_cases(arcase_t* cs, int max) {
  int n = 0;
  static const size_t counts[] = {1, 1000, 65537};
  for (int t = 0; t < 12; t++)
    for (int o = 0; o < 4; o++)
      for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
        if (n < max) cs[n++] = (arcase_t){t, o, MODE_EXACT, 0, counts[k]};
  static const int big[][2] = {{7, 0}, {9, 0}, {2, 2}, {8, 3}, {11, 1}, {4, 1}};
  for (size_t k = 0; k < sizeof big / sizeof big[0]; k++)
    if (n < max) cs[n++] = (arcase_t){big[k][0], big[k][1], MODE_EXACT, 0, (size_t)1 << 20};
  static const int ft[] = {6, 7, 8, 9, 10, 11};
  for (size_t k = 0; k < sizeof ft / sizeof ft[0]; k++)
    for (int o = 0; o < 2; o++)
      if (n < max) cs[n++] = (arcase_t){ft[k], o, MODE_TOL, 0, 4099};
  static const int inpl[][2] = {{7, 0}, {2, 1}, {10, 2}, {0, 3}};
  for (size_t k = 0; k < sizeof inpl / sizeof inpl[0]; k++)
    if (n < max) cs[n++] = (arcase_t){inpl[k][0], inpl[k][1], MODE_EXACT, 1, k % 2 ? 65537 : 1000};
  return n;
}

static void case_desc(const arcase_t* k, char* out, size_t len) {
  snprintf(out, len, "iallreduce(%s %s count %zu%s%s)", tname(k->dt), oname(k->op), k->count,
           k->mode == MODE_TOL ? ", random mantissas" : "", k->inplace ? ", in place" : "");
}

/* compares every rank's published result hashes (rank 0 does it, after a barrier) */
static int compare_hashes(rctx_t* c, int ncase, void (*desc)(int, char*, size_t, const void*), const void* arg) {
  if (sync_ranks(c, "hashes published")) return -1;
  if (c->hc.rank != 0) return 0;
  for (int r = 1; r < c->hc.nranks; r++) {
    if (atomic_load(&c->shm->ncase[r]) != ncase)
      return failf(c, "rank %d published %d results, rank 0 %d", r, atomic_load(&c->shm->ncase[r]), ncase);
    for (int i = 0; i < ncase; i++)
      if (c->shm->hash[r][i] != c->shm->hash[0][i]) {
        char d[160];
        desc(i, d, sizeof d, arg);
        return failf(c, "%s: rank %d's result differs from rank 0's (results must be bit-identical on every rank)", d, r);
      }
  }
  return 0;
}

static void ar_desc(int i, char* out, size_t len, const void* arg) { case_desc((const arcase_t*)arg + i, out, len); }

int scn_allreduce(rctx_t* c) {
  if (std_setup(c)) return -1;
  static arcase_t cs[MAXCASE];
  int ncase = build_ar_cases(cs, MAXCASE);
  size_t maxb = 0;
  for (int i = 0; i < ncase; i++)
    if (cs[i].count * (size_t)g_eltsize[cs[i].dt] > maxb) maxb = cs[i].count * (size_t)g_eltsize[cs[i].dt];
  gbuf_t sb = {0}, rb = {0};
  if (gbuf_alloc(c, &sb, maxb, "send") || gbuf_alloc(c, &rb, maxb, "recv")) return -1;
  unsigned char* scratch = malloc(maxb * (size_t)c->hc.nranks);
  if (!scratch) return failf(c, "out of memory (reference scratch)");
  void *smh, *rmh;
  if (regmr(c, sb.p, maxb, &smh, "send buffer") || regmr(c, rb.p, maxb, &rmh, "recv buffer")) return -1;
  int nulls = 0;
  double t_total = 0;
  for (int i = 0; i < ncase; i++) {
    const arcase_t* k = &cs[i];
    size_t es = (size_t)g_eltsize[k->dt], bytes = k->count * es;
    uint64_t seeds[MAXR] = {0};
    for (int r = 0; r < c->hc.nranks; r++) seeds[r] = seed_of((uint64_t)r, (uint64_t)i, (uint64_t)k->dt * 16 + (uint64_t)k->op);
    cop_t o;
    memset(&o, 0, sizeof o);
    case_desc(k, o.what, sizeof o.what);
    o.kind = K_AR;
    o.count = k->count;
    o.dt = k->dt;
    o.op = k->op;
    if (k->inplace) {
      gbuf_arm(&rb, 0, bytes, 0);
      gen_buf(k->dt, k->op, k->mode, seeds[c->hc.rank], k->count, rb.p);
      o.send = o.recv = rb.p;
      o.smh = o.rmh = rmh;
    } else {
      gbuf_arm(&sb, 0, bytes, 0);
      gen_buf(k->dt, k->op, k->mode, seeds[c->hc.rank], k->count, sb.p);
      gbuf_arm(&rb, 0, bytes, 0x5A); /* stale bytes that are not a plausible result */
      o.send = sb.p;
      o.recv = rb.p;
      o.smh = smh;
      o.rmh = rmh;
    }
    int64_t t0 = now_ns();
    if (cop_run(c, &o)) return -1;
    t_total += ms_since(t0);
    nulls += o.nulls;
    if (o.size != (int)bytes) return failf(c, "%s: test() reported size %d, expected %zu bytes", o.what, o.size, bytes);
    long g = gbuf_guard_bad(&rb, 0, bytes);
    if (g >= 0) return failf(c, "%s: recv buffer written outside [0, %zu): byte offset %ld", o.what, bytes, g);
    if (!k->inplace) {
      g = gbuf_guard_bad(&sb, 0, bytes);
      if (g >= 0) return failf(c, "%s: send buffer's guard changed at offset %ld", o.what, g);
      /* the send buffer must be unchanged */
      gen_buf(k->dt, k->op, k->mode, seeds[c->hc.rank], k->count, scratch);
      if (memcmp(scratch, sb.p, bytes) != 0) return failf(c, "%s: the plugin modified the send buffer", o.what);
    }
    char msg[256] = "";
    size_t bad = check_reduction(k->dt, k->op, k->mode, c->hc.nranks, seeds, k->count, rb.p, scratch, msg, sizeof msg);
    if (bad) return failf(c, "%s: %zu of %zu elements wrong; first: %s", o.what, bad, k->count, msg);
    c->shm->hash[c->hc.rank][i] = hash_bytes(rb.p, bytes);
  }
  atomic_store(&c->shm->ncase[c->hc.rank], ncase);
  if (compare_hashes(c, ncase, ar_desc, cs)) return -1;
  if (deregmr(c, smh, "send") || deregmr(c, rmh, "recv")) return -1;
  gbuf_free(&sb);
  gbuf_free(&rb);
  free(scratch);
  if (std_teardown(c)) return -1;
  if (c->hc.rank == 0)
    detailf(c, "%d cases (12 types x 4 ops x counts 1/1000/65537, 6 x 1Mi elements, 12 random-mantissa, 4 in place), "
            "exact and bit-identical on all ranks; %.0f ms in collectives; %d NULL requests",
            ncase, t_total, nulls);
  return 0;
}

/* ---------------------------------------------------------------- allgather */

typedef struct {
  size_t bpr;
} agdesc_t;

/* window sizes for a buffer of `total` bytes: the whole, then ~0.7 x bpr, then ~1.6 x bpr (both
 * rounded to `unit` and not multiples of bpr where bpr > unit) */
static int window_sizes(size_t bpr, size_t total, size_t unit, size_t* ws) {
  int n = 0;
  ws[n++] = total;
  size_t a = (bpr * 7 / 10 / unit) * unit + unit;
  size_t b = (bpr * 16 / 10 / unit) * unit + unit;
  if (a % bpr == 0 && a + unit < total) a += unit;
  if (b % bpr == 0) b += unit;
  ws[n++] = a < total ? a : total;
  ws[n++] = b < total ? b : total;
  return n;
}

int scn_allgather(rctx_t* c) {
  if (std_setup(c)) return -1;
  static const size_t bprs[] = {1, 4099, 1u << 20};
  int ncalls = 0;
  double t_total = 0;
  for (size_t bi = 0; bi < sizeof bprs / sizeof bprs[0]; bi++) {
    size_t bpr = bprs[bi], total = bpr * (size_t)c->hc.nranks;
    gbuf_t sb = {0}, rb = {0};
    if (gbuf_alloc(c, &sb, bpr, "own slice") || gbuf_alloc(c, &rb, total, "window")) return -1;
    uint64_t seeds[MAXR] = {0};
    for (int r = 0; r < c->hc.nranks; r++) seeds[r] = seed_of((uint64_t)r, 0xA6, bpr);
    pat_fill(sb.p, bpr, seeds[c->hc.rank]);
    void *smh, *rmh;
    if (regmr(c, sb.p, bpr, &smh, "own slice") || regmr(c, rb.p, total, &rmh, "window buffer")) return -1;
    size_t ws[3];
    int nws = window_sizes(bpr, total, 1, ws);
    for (int wi = 0; wi < nws; wi++) {
      size_t w = ws[wi];
      for (size_t off = 0; off < total; off += w) {
        size_t wb = total - off < w ? total - off : w;
        size_t own0 = (size_t)c->hc.rank * bpr, own1 = own0 + bpr;
        size_t s = off > own0 ? off : own0;
        cop_t o;
        memset(&o, 0, sizeof o);
        o.kind = K_AG;
        o.send = (s < own1 && s < off + wb) ? sb.p + (s - own0) : sb.p; /* unused when no overlap */
        o.smh = smh;
        o.part.mhandle = rmh;
        o.part.address = rb.p;
        o.part.size = wb;
        o.bpr = bpr;
        o.off = off;
        o.wb = wb;
        snprintf(o.what, sizeof o.what, "iallgather(bytesPerRank %zu, window [%zu, +%zu) of %zu)", bpr, off, wb, total);
        gbuf_arm(&rb, 0, wb, 0x5A);
        int64_t t0 = now_ns();
        if (cop_run(c, &o)) return -1;
        t_total += ms_since(t0);
        ncalls++;
        long g = gbuf_guard_bad(&rb, 0, wb);
        if (g >= 0)
          return failf(c, "%s: recvParts[0] (%zu B) written outside its range: byte offset %ld", o.what, wb, g);
        for (size_t j = 0; j < wb; j++) {
          size_t gi = off + j;
          int owner = (int)(gi / bpr);
          uint8_t want = pat_byte(seeds[owner], gi % bpr);
          if (rb.p[j] != want)
            return failf(c, "%s: byte %zu of the window (global offset %zu, rank %d's slice offset %zu) is 0x%02x, "
                         "expected 0x%02x", o.what, j, gi, owner, gi % bpr, rb.p[j], want);
        }
        for (size_t j = 0; j < bpr; j++)
          if (sb.p[j] != pat_byte(seeds[c->hc.rank], j)) return failf(c, "%s: the send slice was modified", o.what);
        if (gbuf_guard_bad(&sb, 0, bpr) >= 0) return failf(c, "%s: the send slice's guard bytes changed", o.what);
      }
    }
    if (deregmr(c, smh, "own slice") || deregmr(c, rmh, "window buffer")) return -1;
    gbuf_free(&sb);
    gbuf_free(&rb);
  }
  if (std_teardown(c)) return -1;
  if (c->hc.rank == 0)
    detailf(c, "bytesPerRank 1/4099/1MiB x (whole, ~0.7 and ~1.6 x bpr windows): %d calls, %.0f ms", ncalls, t_total);
  return 0;
}

/* ---------------------------------------------------------------- reducescatter */

int scn_reducescatter(rctx_t* c) {
  if (std_setup(c)) return -1;
  static const struct {
    int dt, op;
    size_t bpr_elems;
  } rs[] = {{7, 0, 1},    {7, 0, 1001}, {2, 2, 1001}, {9, 0, 4099}, {4, 1, 777},
            {10, 3, 333}, {6, 1, 1000}, {7, 0, 262144}, {1, 0, 100003}};
  int ncalls = 0;
  double t_total = 0;
  for (size_t ci = 0; ci < sizeof rs / sizeof rs[0]; ci++) {
    int dt = rs[ci].dt, op = rs[ci].op;
    size_t es = (size_t)g_eltsize[dt], bpr = rs[ci].bpr_elems * es, total = bpr * (size_t)c->hc.nranks;
    size_t ecount = rs[ci].bpr_elems * (size_t)c->hc.nranks;
    gbuf_t ib = {0}, ob = {0};
    if (gbuf_alloc(c, &ib, total, "input") || gbuf_alloc(c, &ob, bpr, "own output slice")) return -1;
    unsigned char* scratch = malloc(total * (size_t)c->hc.nranks + 16);
    unsigned char* exp = malloc(bpr + 16);
    if (!scratch || !exp) return failf(c, "out of memory");
    uint64_t seeds[MAXR] = {0};
    for (int r = 0; r < c->hc.nranks; r++) seeds[r] = seed_of((uint64_t)r, 0x25 + ci, (uint64_t)dt * 16 + (uint64_t)op);
    gen_buf(dt, op, MODE_EXACT, seeds[c->hc.rank], ecount, ib.p);
    /* expected own slice: reduce all ranks' inputs, keep [rank*bpr, +bpr) */
    {
      for (int r = 0; r < c->hc.nranks; r++) gen_buf(dt, op, MODE_EXACT, seeds[r], ecount, scratch + (size_t)r * total);
      for (size_t e = 0; e < rs[ci].bpr_elems; e++) {
        size_t gi = (size_t)c->hc.rank * rs[ci].bpr_elems + e;
        if (!is_float(dt)) {
          uint64_t acc = load_bits(dt, scratch, gi);
          for (int r = 1; r < c->hc.nranks; r++) acc = int_combine(dt, op, acc, load_bits(dt, scratch + (size_t)r * total, gi));
          store_bits(dt, exp, e, acc);
        } else {
          int sp;
          double acc = load_f(dt, scratch, gi, &sp);
          for (int r = 1; r < c->hc.nranks; r++) acc = f_combine(op, acc, load_f(dt, scratch + (size_t)r * total, gi, &sp));
          store_f(dt, exp, e, acc);
        }
      }
    }
    void *smh, *rmh;
    if (regmr(c, ib.p, total, &smh, "input") || regmr(c, ob.p, bpr, &rmh, "output slice")) return -1;
    size_t ws[3];
    int nws = window_sizes(bpr, total, es, ws);
    for (int wi = 0; wi < nws; wi++) {
      size_t w = ws[wi];
      gbuf_arm(&ob, 0, bpr, CANARY); /* the whole output slice is canary until written */
      size_t own0 = (size_t)c->hc.rank * bpr, own1 = own0 + bpr;
      for (size_t off = 0; off < total; off += w) {
        size_t wb = total - off < w ? total - off : w;
        size_t s = off > own0 ? off : own0, e = off + wb < own1 ? off + wb : own1;
        cop_t o;
        memset(&o, 0, sizeof o);
        o.kind = K_RS;
        o.part.mhandle = smh;
        o.part.address = ib.p + off;
        o.part.size = wb;
        o.recv = s < e ? ob.p + (s - own0) : ob.p; /* nothing is written when the window misses the slice */
        o.rmh = rmh;
        o.dt = dt;
        o.op = op;
        o.bpr = bpr;
        o.off = off;
        o.wb = wb;
        snprintf(o.what, sizeof o.what, "ireducescatter(%s %s, bytesPerRank %zu, window [%zu, +%zu) of %zu)", tname(dt),
                 oname(op), bpr, off, wb, total);
        int64_t t0 = now_ns();
        if (cop_run(c, &o)) return -1;
        t_total += ms_since(t0);
        ncalls++;
        /* bytes of the own slice written so far: [0, min(off+wb, own1) - own0) */
        size_t upto = off + wb <= own0 ? 0 : (off + wb >= own1 ? bpr : off + wb - own0);
        for (size_t j = upto; j < bpr; j++)
          if (ob.p[j] != CANARY)
            return failf(c, "%s: output slice byte %zu written although it lies beyond the windows so far (written "
                         "range [0, %zu))", o.what, j, upto);
        long g = gbuf_guard_bad(&ob, 0, bpr);
        if (g >= 0) return failf(c, "%s: output written outside the slice: offset %ld", o.what, g);
        if (s < e && memcmp(ob.p + (s - own0), exp + (s - own0), e - s) != 0) {
          size_t j = s - own0;
          while (j < e - own0 && ob.p[j] == exp[j]) j++;
          size_t el = j / es;
          int sp;
          if (is_float(dt))
            return failf(c, "%s: own slice element %zu (bytes [%zu, %zu) of the slice written by this window) is %.9g, "
                         "expected %.9g", o.what, el, s - own0, e - own0, load_f(dt, ob.p, el, &sp), load_f(dt, exp, el, &sp));
          return failf(c, "%s: own slice element %zu is 0x%" PRIx64 ", expected 0x%" PRIx64, o.what, el,
                       load_bits(dt, ob.p, el), load_bits(dt, exp, el));
        }
        if (memcmp(ib.p, scratch + (size_t)c->hc.rank * total, total) != 0)
          return failf(c, "%s: the plugin modified the send buffer", o.what);
      }
      if (memcmp(ob.p, exp, bpr) != 0) return failf(c, "window size %zu: the own slice is incomplete at the end", w);
    }
    if (deregmr(c, smh, "input") || deregmr(c, rmh, "output")) return -1;
    gbuf_free(&ib);
    gbuf_free(&ob);
    free(scratch);
    free(exp);
  }
  if (sync_ranks(c, "reducescatter done")) return -1;
  if (std_teardown(c)) return -1;
  if (c->hc.rank == 0)
    detailf(c, "9 type/op/bytesPerRank cases x (whole, ~0.7 and ~1.6 x bpr windows): %d calls, exact, %.0f ms", ncalls,
            t_total);
  return 0;
}
