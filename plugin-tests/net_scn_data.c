/*
 * net_scn_data.c: the net_harness scenarios that check transfers between two processes: xfer
 * (sizes 0 B to 64 MiB both ways, with and without iflush) and group (grouped receives of
 * 1..maxRecvs buffers with shuffled tags).
 */
#include "net_harness.h"

/* -------------------------------------------------------------------------------------- xfer */

int scn_xfer(rctx_t* c) {
  if (std_setup(c, 0xc0003)) return -1;
  void *sc, *rc;
  if (pair_both_ways(c, &sc, &rc, 0, 1, "xfer setup")) return -1;
  static const size_t sizes[] = {0, 1, 7, 8, 4095, 4096, 65536, MIB + 3, 4 * MIB, 64 * MIB};
  const int nsizes = (int)(sizeof sizes / sizeof sizes[0]);
  int skipped = 0;
  int64_t t0 = now_ns();
  for (int flush = 0; flush <= 1; flush++) {
    for (int i = 0; i < nsizes; i++) {
      size_t size = sizes[i];
      if (c->net.version >= 9 && size > c->props.maxP2pBytes) {
        skipped++;
        continue;
      }
      char what[96];
      snprintf(what, sizeof what, "xfer size %zu%s", size, flush ? " +iflush" : "");
      unsigned char* sb = xalloc(c, size + 64, "send buffer");
      unsigned char* rb = xalloc(c, size + 64, "recv buffer");
      if (!sb || !rb) return -1;
      void *smh, *rmh;
      if (regmr(c, sc, sb, size + 64, &smh, what) || regmr(c, rc, rb, size + 64, &rmh, what)) return -1;
      uint64_t sseed = seed_of(size, (uint64_t)c->hc.rank, (uint64_t)flush);
      uint64_t rseed = seed_of(size, (uint64_t)(1 - c->hc.rank), (uint64_t)flush);
      pat_fill(sb, size, sseed);
      side_t s = {sc, smh, sb, size, 0, 0, 0x100 + c->hc.rank};
      side_t r = {rc, rmh, rb, size, size + 64, rseed, 0x100 + (1 - c->hc.rank)};
      if (xfer_step(c, &s, &r, flush, what)) return -1;
      if (deregmr(c, sc, smh, what) || deregmr(c, rc, rmh, what)) return -1;
      free(sb);
      free(rb);
    }
  }
  double ms = ms_since(t0);
  if (sync_ranks(c, "xfer done")) return -1;
  if (close_send(c, sc, "xfer") || close_recv(c, rc, "xfer")) return -1;
  if (std_teardown(c)) return -1;
  detailf(c, "%d sizes 0..64 MiB x {plain, iflush} both ways in %.0f ms; iflush: %d NULL requests, %d tested%s",
          nsizes, ms, flush_nulls, flush_reqs, skipped ? "; some sizes > maxP2pBytes skipped" : "");
  return 0;
}

/* ------------------------------------------------------------------------------------- group */

static void shuffle(int* a, int n, uint64_t seed) {
  for (int i = 0; i < n; i++) a[i] = i;
  for (int i = n - 1; i > 0; i--) {
    seed = mix64(seed + (uint64_t)i);
    int j = (int)(seed % (uint64_t)(i + 1));
    int t = a[i];
    a[i] = a[j];
    a[j] = t;
  }
}

/* What a stuck grouped receive has in its buffers: untouched (canary), complete or partial. */
typedef struct {
  int nbuf;
  unsigned char** buf;
  const size_t* expect;
  const uint64_t* seed;
  const int* tags;
} gdiag_t;

static void group_diag(rctx_t* c, char* out, size_t len) {
  const gdiag_t* g = c->diag_arg;
  size_t used = 0;
  for (int i = 0; i < g->nbuf && used + 80 < len; i++) {
    const char* st;
    size_t nbad = 0;
    long bad = pat_check(g->buf[i], g->expect[i], g->seed[i], &nbad);
    if (bad < 0 && (g->expect[i] == 0 ? g->buf[i][0] == CANARY : 1)) st = g->expect[i] ? "complete" : "empty(ok?)";
    else if (nbad == g->expect[i] && g->buf[i][0] == CANARY) st = "untouched";
    else st = "partial";
    used += (size_t)snprintf(out + used, len - used, "%sbuf %d tag %d %zu B: %s", i ? ", " : "buffers: ", i,
                             g->tags[i], g->expect[i], st);
    if (strcmp(st, "partial") == 0) {
      size_t own = 0, can = 0;
      for (size_t k = 0; k < g->expect[i]; k++) {
        own += g->buf[i][k] == pat_byte(g->seed[i], k);
        can += g->buf[i][k] == CANARY;
      }
      used += (size_t)snprintf(out + used, len - used, " [%zu B own data, %zu B canary]", own, can);
    }
    if (strcmp(st, "partial") == 0 || strcmp(st, "untouched") == 0)
      for (int j = 0; j < g->nbuf && used + 64 < len; j++) /* holds another buffer's message? */
        if (j != i && g->expect[j] > 0 && g->expect[j] <= g->expect[i] &&
            pat_check(g->buf[i], g->expect[j], g->seed[j], NULL) < 0)
          used += (size_t)snprintf(out + used, len - used, " (holds the %zu-B message for tag %d)", g->expect[j],
                                   g->tags[j]);
  }
}

size_t group_size(int n, int round, int i) {
  static const size_t base[8] = {1, 4096, 100000, 0, 65537, 257, MIB, 31};
  size_t b = base[(i + n + round * 3) % 8];
  return b == 0 ? 0 : b + (size_t)i * 3 + (size_t)round;
}

int scn_group(rctx_t* c) {
  if (std_setup(c, 0xc0004)) return -1;
  void *sc, *rc;
  if (pair_one_way(c, &sc, &rc, 0, 1, "group setup")) return -1;
  int maxr = c->props.maxRecvs;
  if (maxr > GMAX) maxr = GMAX;
  const size_t cap = MIB + 256;
  unsigned char* buf[2][GMAX];
  void* mh[2][GMAX];
  void* comm = c->hc.rank == 0 ? sc : rc;
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < maxr; i++) {
      buf[k][i] = xalloc(c, cap, "group buffer");
      if (!buf[k][i] || regmr(c, comm, buf[k][i], cap, &mh[k][i], "group")) return -1;
    }
  int tags[GMAX];
  /* Part 1: one grouped receive of n buffers, n = 1..maxRecvs; sends in shuffled order. */
  for (int n = 1; n <= maxr; n++) {
    char what[96];
    snprintf(what, sizeof what, "group n=%d", n);
    for (int i = 0; i < n; i++) tags[i] = 1000 + n * 100 + i * 7;
    if (c->hc.rank == 1) {
      void* data[GMAX];
      size_t caps[GMAX];
      void* mhs[GMAX];
      for (int i = 0; i < n; i++) {
        memset(buf[0][i], CANARY, cap);
        data[i] = buf[0][i];
        caps[i] = group_size(n, 0, i) + 16 + (size_t)i;
        mhs[i] = mh[0][i];
      }
      op_t op;
      if (post_irecv(c, rc, n, data, caps, tags, mhs, &op, NULL, 0, NULL, what)) return -1;
      op_t* ops[1] = {&op};
      size_t expect[GMAX];
      uint64_t seeds[GMAX];
      for (int i = 0; i < n; i++) expect[i] = group_size(n, 0, i), seeds[i] = seed_of(n, i, 0);
      gdiag_t gd = {n, buf[0], expect, seeds, tags};
      c->diag = group_diag;
      c->diag_arg = &gd;
      int wr = wait_ops(c, ops, 1, what);
      c->diag = NULL;
      if (wr) return -1;
      if (check_sizes_tail(c, what, &op, n)) return -1;
      for (int i = 0; i < n; i++) {
        char w2[128];
        snprintf(w2, sizeof w2, "%s buffer %d (tag %d)", what, i, tags[i]);
        if (verify_buf(c, w2, buf[0][i], caps[i], group_size(n, 0, i), seed_of(n, i, 0), op.sizes[i])) return -1;
      }
    } else {
      int order[GMAX];
      shuffle(order, n, (uint64_t)n * 77);
      op_t ops[GMAX];
      op_t* po[GMAX];
      for (int k = 0; k < n; k++) {
        int i = order[k];
        pat_fill(buf[0][i], group_size(n, 0, i), seed_of(n, i, 0));
        if (post_isend(c, sc, buf[0][i], group_size(n, 0, i), tags[i], mh[0][i], &ops[k], po, k, NULL, what)) return -1;
        po[k] = &ops[k];
      }
      if (wait_ops(c, po, n, what)) return -1;
      for (int k = 0; k < n; k++)
        if (ops[k].sizes[0] != (int)group_size(n, 0, order[k]))
          return failf(c, "%s: send of buffer %d reported %d bytes, expected %zu", what, order[k], ops[k].sizes[0],
                       group_size(n, 0, order[k]));
    }
  }
  /* Part 2: two grouped receives outstanding with the same tags: matching is in posted order,
   * so round 1's sends fill the first, round 2's the second. */
  {
    int n = maxr;
    const char* what = "group posted-order (2 receives, same tags)";
    for (int i = 0; i < n; i++) tags[i] = 5000 + i * 3;
    if (c->hc.rank == 1) {
      void* data[2][GMAX];
      size_t caps[2][GMAX];
      void* mhs[2][GMAX];
      op_t op[2];
      op_t* po[2] = {&op[0], &op[1]};
      for (int k = 0; k < 2; k++) {
        for (int i = 0; i < n; i++) {
          memset(buf[k][i], CANARY, cap);
          data[k][i] = buf[k][i];
          caps[k][i] = MIB + 128;
          mhs[k][i] = mh[k][i];
        }
        if (post_irecv(c, rc, n, data[k], caps[k], tags, mhs[k], &op[k], po, k, NULL, what)) return -1;
      }
      if (wait_ops(c, po, 2, what)) return -1;
      for (int k = 0; k < 2; k++)
        for (int i = 0; i < n; i++) {
          char w2[160];
          snprintf(w2, sizeof w2, "%s: receive #%d buffer %d (tag %d)", what, k + 1, i, tags[i]);
          if (verify_buf(c, w2, buf[k][i], caps[k][i], group_size(100, k + 1, i), seed_of(100 + k, i, 1),
                         op[k].sizes[i]))
            return -1;
        }
    } else {
      op_t ops[2 * GMAX];
      op_t* po[2 * GMAX];
      int np = 0;
      for (int k = 0; k < 2; k++) {
        int order[GMAX];
        shuffle(order, n, 991 + (uint64_t)k);
        for (int j = 0; j < n; j++) {
          int i = order[j];
          size_t sz = group_size(100, k + 1, i);
          pat_fill(buf[k][i], sz, seed_of(100 + k, i, 1));
          if (post_isend(c, sc, buf[k][i], sz, tags[i], mh[k][i], &ops[np], po, np, NULL, what)) return -1;
          po[np] = &ops[np];
          np++;
        }
      }
      if (wait_ops(c, po, np, what)) return -1;
    }
  }
  if (sync_ranks(c, "group done")) return -1;
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < maxr; i++) {
      if (deregmr(c, comm, mh[k][i], "group")) return -1;
      free(buf[k][i]);
    }
  if (c->hc.rank == 0 && close_send(c, sc, "group")) return -1;
  if (c->hc.rank == 1 && close_recv(c, rc, "group")) return -1;
  if (std_teardown(c)) return -1;
  detailf(c, "n=1..%d grouped receives with shuffled tagged sends, plus 2 outstanding same-tag groups in posted order",
          maxr);
  return 0;
}
