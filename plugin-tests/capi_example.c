/*
 * capi_example.c - the fabricoll native C API (include/fabricoll.h), end to end, in C.
 *
 * The parent forks N ranks (default 4) and waits for them with a deadline; rank 0 makes the unique
 * id (its process hosts the bootstrap root) and hands it to the others through shared memory, as
 * an MPI program would with MPI_Bcast. Each rank:
 *   - creates its communicator (fabricoll_comm_init_rank; under a launcher a program would call
 *     fabricoll_comm_init_env instead), checks rank and size;
 *   - runs every collective blocking (allreduce float sum / int32 max / double avg / int64 min,
 *     count 0, 1 and 256 Ki, in place; allgather, also in place; reducescatter; broadcast from
 *     rank 0 and from the last rank; reduce to rank 1 and to the last rank; alltoall) and checks
 *     each result against values computed here;
 *   - starts seven non-blocking collectives at once (fabricoll_i* and fabricoll_collective with a
 *     request), completes some by polling fabricoll_test and the others with fabricoll_wait;
 *   - send / recv around the ring, blocking and non-blocking (two messages in flight, in order);
 *   - fabricoll_comm_split into even and odd ranks (reversed key order) with an allreduce and an
 *     allgather on each half, and a split where rank 0 joins nothing (color -1);
 *   - fabricoll_collective with a per-call algorithm (ring, then rdh, ...); fabricoll_comm_set_algo;
 *   - fabricoll_collective_options with per-call compression (bf16, int8: the same bits on every
 *     rank, within the documented bound; int32 data and op max refused naming `compress`);
 *   - error paths: each must return a non-zero status and fabricoll_last_error() must name the
 *     argument (printed); then the communicator must still work;
 *   - fabricoll_comm_abort on a duplicate communicator, fabricoll_comm_destroy, use after destroy.
 * Results go through a shared mapping to the parent, which prints
 * "capi_example: N passed, M failed" (checks summed over ranks) and exits non-zero on failure.
 * Every wait in the parent has a deadline; ranks still alive after it are killed.
 *
 * Usage: capi_example [-n NRANKS] [-t TIMEOUT_S] [-v]    (env CAPI_VERBOSE=1 == -v)
 * Environment: FABRICOLL_* as usual (FABRICOLL_PROVIDER=tcp needs FABRICOLL_DOMAIN=lo here).
 */
#include "fabricoll.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef CAPI_ENUM_FALLBACK
/* The Makefile defines CAPI_ENUM_FALLBACK when include/fabricoll.h lacks the datatype / op /
 * algorithm / collective enums (a bug of the header, reported as a failed check below). These
 * are the values src/ffi/api/types.rs documents (NCCL's for types and ops). */
enum { FABRICOLL_INT8 = 0, FABRICOLL_UINT8 = 1, FABRICOLL_INT32 = 2, FABRICOLL_UINT32 = 3,
       FABRICOLL_INT64 = 4, FABRICOLL_UINT64 = 5, FABRICOLL_FLOAT16 = 6, FABRICOLL_FLOAT32 = 7,
       FABRICOLL_FLOAT64 = 8, FABRICOLL_BFLOAT16 = 9, FABRICOLL_FP8_E4M3 = 10,
       FABRICOLL_FP8_E5M2 = 11 };
enum { FABRICOLL_SUM = 0, FABRICOLL_PROD = 1, FABRICOLL_MAX = 2, FABRICOLL_MIN = 3,
       FABRICOLL_AVG = 4, FABRICOLL_BAND = 5, FABRICOLL_BOR = 6, FABRICOLL_BXOR = 7 };
enum { FABRICOLL_ALGO_AUTO = 0, FABRICOLL_ALGO_RING = 1, FABRICOLL_ALGO_BIDIR_RING = 2,
       FABRICOLL_ALGO_MESH = 3, FABRICOLL_ALGO_MESH1 = 4, FABRICOLL_ALGO_RDH = 5,
       FABRICOLL_ALGO_RD = 6, FABRICOLL_ALGO_TREE = 7, FABRICOLL_ALGO_DBTREE = 8,
       FABRICOLL_ALGO_BRUCK = 9, FABRICOLL_ALGO_PAIRWISE = 10, FABRICOLL_ALGO_HIER = 11,
       FABRICOLL_ALGO_SWIZZLE = 12 };
enum { FABRICOLL_COLL_ALLREDUCE = 0, FABRICOLL_COLL_ALLGATHER = 1,
       FABRICOLL_COLL_REDUCESCATTER = 2, FABRICOLL_COLL_BROADCAST = 3, FABRICOLL_COLL_REDUCE = 4,
       FABRICOLL_COLL_ALLTOALL = 5 };
#endif

/* The values of every enum in include/fabricoll.h are part of the ABI: pin them here (the Rust
 * side pins the same numbers in src/ffi/api/tests.rs). */
#define PIN(name, value) _Static_assert((name) == (value), #name " changed its value")
PIN(FABRICOLL_SUCCESS, 0); PIN(FABRICOLL_INVALID_ARGUMENT, 1); PIN(FABRICOLL_INVALID_USAGE, 2);
PIN(FABRICOLL_SYSTEM_ERROR, 3); PIN(FABRICOLL_INTERNAL_ERROR, 4); PIN(FABRICOLL_REMOTE_ERROR, 5);
PIN(FABRICOLL_TIMEOUT, 6); PIN(FABRICOLL_IN_PROGRESS, 7);
PIN(FABRICOLL_INT8, 0); PIN(FABRICOLL_UINT8, 1); PIN(FABRICOLL_INT32, 2); PIN(FABRICOLL_UINT32, 3);
PIN(FABRICOLL_INT64, 4); PIN(FABRICOLL_UINT64, 5); PIN(FABRICOLL_FLOAT16, 6);
PIN(FABRICOLL_FLOAT32, 7); PIN(FABRICOLL_FLOAT64, 8); PIN(FABRICOLL_BFLOAT16, 9);
PIN(FABRICOLL_FP8_E4M3, 10); PIN(FABRICOLL_FP8_E5M2, 11);
PIN(FABRICOLL_SUM, 0); PIN(FABRICOLL_PROD, 1); PIN(FABRICOLL_MAX, 2); PIN(FABRICOLL_MIN, 3);
PIN(FABRICOLL_AVG, 4); PIN(FABRICOLL_BAND, 5); PIN(FABRICOLL_BOR, 6); PIN(FABRICOLL_BXOR, 7);
PIN(FABRICOLL_ALGO_AUTO, 0); PIN(FABRICOLL_ALGO_RING, 1); PIN(FABRICOLL_ALGO_BIDIR_RING, 2);
PIN(FABRICOLL_ALGO_MESH, 3); PIN(FABRICOLL_ALGO_MESH1, 4); PIN(FABRICOLL_ALGO_RDH, 5);
PIN(FABRICOLL_ALGO_RD, 6); PIN(FABRICOLL_ALGO_TREE, 7); PIN(FABRICOLL_ALGO_DBTREE, 8);
PIN(FABRICOLL_ALGO_BRUCK, 9); PIN(FABRICOLL_ALGO_PAIRWISE, 10); PIN(FABRICOLL_ALGO_HIER, 11);
PIN(FABRICOLL_ALGO_SWIZZLE, 12);
PIN(FABRICOLL_COLL_ALLREDUCE, 0); PIN(FABRICOLL_COLL_ALLGATHER, 1);
PIN(FABRICOLL_COLL_REDUCESCATTER, 2); PIN(FABRICOLL_COLL_BROADCAST, 3);
PIN(FABRICOLL_COLL_REDUCE, 4); PIN(FABRICOLL_COLL_ALLTOALL, 5);
PIN(FABRICOLL_COMPRESS_DEFAULT, 0); PIN(FABRICOLL_COMPRESS_OFF, 1); PIN(FABRICOLL_COMPRESS_BF16, 2);
PIN(FABRICOLL_COMPRESS_FP16, 3); PIN(FABRICOLL_COMPRESS_FP8E4M3, 4); PIN(FABRICOLL_COMPRESS_FP8E5M2, 5);
PIN(FABRICOLL_COMPRESS_INT8, 6);
#undef PIN

#define MAX_RANKS 64

/* One slot per rank in a MAP_SHARED mapping: the parent reads the counts after the ranks end. */
struct slot {
  int pass, fail, finished;
};

/* The unique id goes from rank 0 to the other ranks through this shared page (any channel
 * works: MPI, a file, a socket). Rank 0 makes it, which starts the bootstrap root's thread in
 * rank 0's process. The parent starts no thread before fork(): a child forked while another
 * thread holds a lock (malloc's, ASan's allocator's) can wait on it forever. */
struct idbox {
  int ready; /* 0 not yet, 1 id valid, -1 rank 0 failed to make it */
  fabricoll_unique_id id;
};

static int g_rank, g_n, g_verbose;
static struct slot *g_slot;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Record one check. PASS lines come from rank 0 only (all ranks with -v); FAIL from every rank. */
static int check(int ok, const char *name, const char *fmt, ...) {
  if (ok) {
    g_slot->pass++;
    if (g_rank == 0 || g_verbose) printf("rank %d: PASS %s\n", g_rank, name);
  } else {
    char msg[512] = "";
    if (fmt) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(msg, sizeof msg, fmt, ap);
      va_end(ap);
    }
    g_slot->fail++;
    printf("rank %d: FAIL %s: %s\n", g_rank, name, msg);
  }
  fflush(stdout);
  return ok;
}

/* A call that must succeed: on failure the check fails with the status and the library's text. */
static int ok_call(fabricoll_status s, const char *name) {
  if (s == FABRICOLL_SUCCESS) return 1;
  check(0, name, "status %d (%s): %s", (int)s, fabricoll_status_string((int)s),
        fabricoll_last_error());
  return 0;
}

/* ---- input values (small integers: every sum is exact) ------------------------------------- */
static float vf(int r, size_t i) { return (float)((r * 7 + (int)(i % 1013) * 3) % 11 + 1); }
static int32_t vi(int r, size_t i) { return (int32_t)((r * 31 + (int)(i % 997) * 17) % 101) - 50; }
static double vd(int r, size_t i) { return (r + 1) * 0.5 + (double)(i % 97); }
static int64_t vl(int r, size_t i) { return ((int64_t)r - (int64_t)(i % 89)) * 1000000000000LL; }
static uint8_t vb(int r, size_t i) { return (uint8_t)(r * 13 + i * 7 + 1); }

/* compare helpers: count mismatches, describe the first */
#define CMP_LOOP(T, got, want, cnt, eq, fmtspec)                                            \
  do {                                                                                      \
    for (size_t i_ = 0; i_ < (cnt); i_++) {                                                 \
      T g_ = (got)[i_], w_ = (want)[i_];                                                    \
      if (!(eq)) {                                                                          \
        if (!bad_)                                                                          \
          snprintf(first_, sizeof first_, "element %zu: got " fmtspec ", want " fmtspec, i_, \
                   g_, w_);                                                                 \
        bad_++;                                                                             \
      }                                                                                     \
    }                                                                                       \
  } while (0)

static int cmp_f(const char *name, const float *got, const float *want, size_t cnt) {
  size_t bad_ = 0;
  char first_[160] = "";
  CMP_LOOP(float, got, want, cnt, g_ == w_, "%g");
  return check(bad_ == 0, name, "%zu of %zu wrong, first %s", bad_, cnt, first_);
}
static int cmp_i(const char *name, const int32_t *got, const int32_t *want, size_t cnt) {
  size_t bad_ = 0;
  char first_[160] = "";
  CMP_LOOP(int32_t, got, want, cnt, g_ == w_, "%d");
  return check(bad_ == 0, name, "%zu of %zu wrong, first %s", bad_, cnt, first_);
}
static int cmp_d(const char *name, const double *got, const double *want, size_t cnt) {
  size_t bad_ = 0;
  char first_[160] = "";
  CMP_LOOP(double, got, want, cnt, fabs(g_ - w_) <= 1e-12 * fmax(1.0, fabs(w_)), "%.17g");
  return check(bad_ == 0, name, "%zu of %zu wrong, first %s", bad_, cnt, first_);
}
static int cmp_l(const char *name, const int64_t *got, const int64_t *want, size_t cnt) {
  size_t bad_ = 0;
  char first_[160] = "";
  CMP_LOOP(long long, got, want, cnt, g_ == w_, "%lld");
  return check(bad_ == 0, name, "%zu of %zu wrong, first %s", bad_, cnt, first_);
}
static int cmp_b(const char *name, const uint8_t *got, const uint8_t *want, size_t cnt) {
  size_t bad_ = 0;
  char first_[160] = "";
  CMP_LOOP(unsigned, got, want, cnt, g_ == w_, "%u");
  return check(bad_ == 0, name, "%zu of %zu wrong, first %s", bad_, cnt, first_);
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "rank %d: out of memory (%zu bytes)\n", g_rank, n);
    _exit(3);
  }
  return p;
}

/* ---- expected values ---------------------------------------------------------------------- */
static float sum_f(int n, size_t i) {
  float s = 0;
  for (int r = 0; r < n; r++) s += vf(r, i);
  return s;
}
static int32_t max_i(int n, size_t i) {
  int32_t m = vi(0, i);
  for (int r = 1; r < n; r++)
    if (vi(r, i) > m) m = vi(r, i);
  return m;
}
static double avg_d(int n, size_t i) {
  double s = 0;
  for (int r = 0; r < n; r++) s += vd(r, i);
  return s / n;
}
static int64_t min_l(int n, size_t i) {
  int64_t m = vl(0, i);
  for (int r = 1; r < n; r++)
    if (vl(r, i) < m) m = vl(r, i);
  return m;
}

/* ---- the phases ----------------------------------------------------------------------------- */

static void allreduce_float_sum(fabricoll_comm *comm, size_t count, const char *name) {
  float *s = xmalloc(count * sizeof *s), *r = xmalloc(count * sizeof *r), *w = xmalloc(count * sizeof *w);
  for (size_t i = 0; i < count; i++) s[i] = vf(g_rank, i), r[i] = -1.0f, w[i] = sum_f(g_n, i);
  if (ok_call(fabricoll_allreduce(s, r, count, FABRICOLL_FLOAT32, FABRICOLL_SUM, comm), name))
    cmp_f(name, r, w, count);
  free(s), free(r), free(w);
}

static void blocking(fabricoll_comm *comm) {
  const int n = g_n, me = g_rank;

  allreduce_float_sum(comm, 1003, "allreduce float sum (1003)");
  allreduce_float_sum(comm, 1, "allreduce float sum (count 1 < nranks)");
  allreduce_float_sum(comm, 256 * 1024, "allreduce float sum (256 Ki elements, 1 MiB)");
  {
    float a = 5.0f, b = 7.0f; /* count 0: nothing to do, must succeed and touch nothing */
    if (ok_call(fabricoll_allreduce(&a, &b, 0, FABRICOLL_FLOAT32, FABRICOLL_SUM, comm), "allreduce count 0"))
      check(b == 7.0f, "allreduce count 0", "recvbuf changed to %g", b);
  }
  { /* int32 max, negative values */
    size_t c = 517;
    int32_t *s = xmalloc(c * 4), *r = xmalloc(c * 4), *w = xmalloc(c * 4);
    for (size_t i = 0; i < c; i++) s[i] = vi(me, i), r[i] = 0x7eadbeef, w[i] = max_i(n, i);
    if (ok_call(fabricoll_allreduce(s, r, c, FABRICOLL_INT32, FABRICOLL_MAX, comm), "allreduce int32 max"))
      cmp_i("allreduce int32 max", r, w, c);
    free(s), free(r), free(w);
  }
  { /* double avg */
    size_t c = 129;
    double *s = xmalloc(c * 8), *r = xmalloc(c * 8), *w = xmalloc(c * 8);
    for (size_t i = 0; i < c; i++) s[i] = vd(me, i), r[i] = -1, w[i] = avg_d(n, i);
    if (ok_call(fabricoll_allreduce(s, r, c, FABRICOLL_FLOAT64, FABRICOLL_AVG, comm), "allreduce double avg"))
      cmp_d("allreduce double avg", r, w, c);
    free(s), free(r), free(w);
  }
  { /* int64 min, values beyond 32 bits */
    size_t c = 64;
    int64_t *s = xmalloc(c * 8), *r = xmalloc(c * 8), *w = xmalloc(c * 8);
    for (size_t i = 0; i < c; i++) s[i] = vl(me, i), r[i] = 0, w[i] = min_l(n, i);
    if (ok_call(fabricoll_allreduce(s, r, c, FABRICOLL_INT64, FABRICOLL_MIN, comm), "allreduce int64 min"))
      cmp_l("allreduce int64 min", r, w, c);
    free(s), free(r), free(w);
  }
  { /* in place */
    size_t c = 777;
    float *b = xmalloc(c * 4), *w = xmalloc(c * 4);
    for (size_t i = 0; i < c; i++) b[i] = vf(me, i), w[i] = sum_f(n, i);
    if (ok_call(fabricoll_allreduce(b, b, c, FABRICOLL_FLOAT32, FABRICOLL_SUM, comm), "allreduce in place float sum"))
      cmp_f("allreduce in place float sum", b, w, c);
    free(b), free(w);
  }
  { /* allgather int32, out of place and in place (NCCL layout: sendbuf = recvbuf + rank * count) */
    size_t c = 37, tot = c * (size_t)n;
    int32_t *s = xmalloc(c * 4), *r = xmalloc(tot * 4), *w = xmalloc(tot * 4);
    for (size_t i = 0; i < c; i++) s[i] = vi(me, i);
    for (size_t j = 0; j < tot; j++) r[j] = -999, w[j] = vi((int)(j / c), j % c);
    if (ok_call(fabricoll_allgather(s, r, c, FABRICOLL_INT32, comm), "allgather int32"))
      cmp_i("allgather int32", r, w, tot);
    for (size_t j = 0; j < tot; j++) r[j] = -999;
    for (size_t i = 0; i < c; i++) r[(size_t)me * c + i] = vi(me, i);
    if (ok_call(fabricoll_allgather(r + (size_t)me * c, r, c, FABRICOLL_INT32, comm), "allgather in place int32"))
      cmp_i("allgather in place int32", r, w, tot);
    free(s), free(r), free(w);
  }
  { /* reducescatter float sum */
    size_t c = 33, tot = c * (size_t)n;
    float *s = xmalloc(tot * 4), *r = xmalloc(c * 4), *w = xmalloc(c * 4);
    for (size_t j = 0; j < tot; j++) s[j] = vf(me, j);
    for (size_t i = 0; i < c; i++) r[i] = -1, w[i] = sum_f(n, (size_t)me * c + i);
    if (ok_call(fabricoll_reducescatter(s, r, c, FABRICOLL_FLOAT32, FABRICOLL_SUM, comm), "reducescatter float sum"))
      cmp_f("reducescatter float sum", r, w, c);
    free(s), free(r), free(w);
  }
  { /* reducescatter double max */
    size_t c = 10, tot = c * (size_t)n;
    double *s = xmalloc(tot * 8), *r = xmalloc(c * 8), *w = xmalloc(c * 8);
    for (size_t j = 0; j < tot; j++) s[j] = vd(me, j) * ((j + (size_t)me) % 3 ? 1 : -1);
    for (size_t i = 0; i < c; i++) {
      size_t j = (size_t)me * c + i;
      double m = -1e300;
      for (int q = 0; q < n; q++) m = fmax(m, vd(q, j) * ((j + (size_t)q) % 3 ? 1 : -1));
      r[i] = 0, w[i] = m;
    }
    if (ok_call(fabricoll_reducescatter(s, r, c, FABRICOLL_FLOAT64, FABRICOLL_MAX, comm), "reducescatter double max"))
      cmp_d("reducescatter double max", r, w, c);
    free(s), free(r), free(w);
  }
  { /* broadcast uint8 from rank 0 (sendbuf NULL elsewhere), int64 from the last rank */
    size_t c = 1000;
    uint8_t *s = xmalloc(c), *r = xmalloc(c), *w = xmalloc(c);
    for (size_t i = 0; i < c; i++) s[i] = vb(0, i), r[i] = 0xee, w[i] = vb(0, i);
    if (ok_call(fabricoll_broadcast(me == 0 ? s : NULL, r, c, FABRICOLL_UINT8, 0, comm), "broadcast uint8 root 0"))
      cmp_b("broadcast uint8 root 0", r, w, c);
    free(s), free(r), free(w);
    int root = n - 1;
    size_t c2 = 100;
    int64_t *s2 = xmalloc(c2 * 8), *r2 = xmalloc(c2 * 8), *w2 = xmalloc(c2 * 8);
    for (size_t i = 0; i < c2; i++) s2[i] = vl(root, i), r2[i] = 42, w2[i] = vl(root, i);
    if (ok_call(fabricoll_broadcast(s2, r2, c2, FABRICOLL_INT64, root, comm), "broadcast int64 root n-1"))
      cmp_l("broadcast int64 root n-1", r2, w2, c2);
    free(s2), free(r2), free(w2);
  }
  { /* reduce float sum to rank 1 (recvbuf NULL elsewhere), int32 max to the last rank */
    int root = 1 % n;
    size_t c = 500;
    float *s = xmalloc(c * 4), *r = xmalloc(c * 4), *w = xmalloc(c * 4);
    for (size_t i = 0; i < c; i++) s[i] = vf(me, i), r[i] = -1, w[i] = sum_f(n, i);
    if (ok_call(fabricoll_reduce(s, me == root ? r : NULL, c, FABRICOLL_FLOAT32, FABRICOLL_SUM, root, comm),
                "reduce float sum root 1")) {
      if (me == root) cmp_f("reduce float sum root 1", r, w, c);
      else check(1, "reduce float sum root 1", NULL);
    }
    free(s), free(r), free(w);
    root = n - 1;
    size_t c2 = 300;
    int32_t *s2 = xmalloc(c2 * 4), *r2 = xmalloc(c2 * 4), *w2 = xmalloc(c2 * 4);
    for (size_t i = 0; i < c2; i++) s2[i] = vi(me, i), r2[i] = 77, w2[i] = me == root ? max_i(n, i) : 77;
    if (ok_call(fabricoll_reduce(s2, r2, c2, FABRICOLL_INT32, FABRICOLL_MAX, root, comm), "reduce int32 max root n-1"))
      cmp_i("reduce int32 max root n-1 (non-roots' recvbuf untouched)", r2, w2, c2);
    free(s2), free(r2), free(w2);
  }
  { /* alltoall int32: block j of rank i lands as block i of rank j */
    size_t c = 5, tot = c * (size_t)n;
    int32_t *s = xmalloc(tot * 4), *r = xmalloc(tot * 4), *w = xmalloc(tot * 4);
    for (size_t j = 0; j < tot; j++) {
      s[j] = (int32_t)(me * 10000 + (int)(j / c) * 100 + (int)(j % c));
      w[j] = (int32_t)((int)(j / c) * 10000 + me * 100 + (int)(j % c));
      r[j] = -1;
    }
    if (ok_call(fabricoll_alltoall(s, r, c, FABRICOLL_INT32, comm), "alltoall int32"))
      cmp_i("alltoall int32", r, w, tot);
    free(s), free(r), free(w);
  }
}

/* Complete requests: poll fabricoll_test on the first npoll, fabricoll_wait on the rest. */
static void complete(fabricoll_request **req, const char **names, int nreq, int npoll, int *okv) {
  int left = 0;
  for (int k = 0; k < npoll; k++) left += req[k] != NULL;
  double deadline = now_s() + 120;
  long polls = 0;
  while (left > 0 && now_s() < deadline) {
    for (int k = 0; k < npoll; k++) {
      if (!req[k]) continue;
      int done = -1;
      fabricoll_status s = fabricoll_test(req[k], &done);
      polls++;
      if (s != FABRICOLL_SUCCESS) {
        ok_call(s, names[k]);
        okv[k] = 0;
        req[k] = NULL, left--;
      } else if (done == 1) {
        okv[k] = 1;
        req[k] = NULL, left--;
      } else if (done != 0) {
        check(0, names[k], "fabricoll_test set *done to %d", done);
      }
    }
  }
  for (int k = 0; k < npoll; k++)
    if (req[k]) {
      check(0, names[k], "fabricoll_test never reported completion in 120 s (%ld polls)", polls);
      req[k] = NULL; /* leaked on purpose: the communicator's destroy frees it */
    }
  for (int k = npoll; k < nreq; k++) {
    if (!req[k]) continue;
    okv[k] = ok_call(fabricoll_wait(req[k]), names[k]);
    req[k] = NULL;
  }
}

static void nonblocking(fabricoll_comm *comm) {
  const int n = g_n, me = g_rank;
  enum { A, B, C, D, E, F, G, NREQ };
  const char *names[NREQ] = {
      "iallreduce float sum (test)",     "iallgather int32 (test)",
      "ireducescatter double sum (test)", "fabricoll_collective allreduce int32 sum ring, request (test)",
      "ibroadcast float root n-1 (wait)", "ireduce int64 sum root 0 (wait)",
      "ialltoall int32 (wait)"};
  fabricoll_request *req[NREQ] = {0};
  int okv[NREQ] = {0};
  size_t ca = 4099, cb = 129, cc = 65, cd = 2000, ce = 300, cf = 3;
  int rootd = n - 1, roote = 0;
  float *as = xmalloc(ca * 4), *ar = xmalloc(ca * 4), *aw = xmalloc(ca * 4);
  int32_t *bs = xmalloc(cb * 4), *br = xmalloc(cb * n * 4), *bw = xmalloc(cb * n * 4);
  double *cs = xmalloc(cc * n * 8), *cr = xmalloc(cc * 8), *cw = xmalloc(cc * 8);
  int32_t *gs = xmalloc(ca * 4), *gr = xmalloc(ca * 4), *gw = xmalloc(ca * 4);
  float *ds = xmalloc(cd * 4), *dr = xmalloc(cd * 4), *dw = xmalloc(cd * 4);
  int64_t *es = xmalloc(ce * 8), *er = xmalloc(ce * 8), *ew = xmalloc(ce * 8);
  int32_t *fs = xmalloc(cf * n * 4), *fr = xmalloc(cf * n * 4), *fw = xmalloc(cf * n * 4);
  for (size_t i = 0; i < ca; i++) {
    as[i] = vf(me, i + 5), ar[i] = -1, aw[i] = sum_f(n, i + 5);
    gs[i] = vi(me, i), gr[i] = -1, gw[i] = 0;
    for (int q = 0; q < n; q++) gw[i] += vi(q, i);
  }
  for (size_t i = 0; i < cb; i++) bs[i] = vi(me, i + 1);
  for (size_t j = 0; j < cb * n; j++) br[j] = 0, bw[j] = vi((int)(j / cb), j % cb + 1);
  for (size_t j = 0; j < cc * n; j++) cs[j] = vd(me, j);
  for (size_t i = 0; i < cc; i++) {
    cr[i] = 0, cw[i] = 0;
    for (int q = 0; q < n; q++) cw[i] += vd(q, (size_t)me * cc + i);
  }
  for (size_t i = 0; i < cd; i++) ds[i] = vf(rootd, i) * 0.25f, dr[i] = -5, dw[i] = vf(rootd, i) * 0.25f;
  for (size_t i = 0; i < ce; i++) {
    es[i] = vl(me, i) + me, er[i] = 9, ew[i] = 0;
    for (int q = 0; q < n; q++) ew[i] += vl(q, i) + q;
  }
  for (size_t j = 0; j < cf * n; j++) {
    fs[j] = (int32_t)(me * 1000 + (int)j);
    fw[j] = (int32_t)((int)(j / cf) * 1000 + me * (int)cf + (int)(j % cf));
    fr[j] = -1;
  }
  fabricoll_call gcall = {FABRICOLL_COLL_ALLREDUCE, gs, gr, ca, FABRICOLL_INT32, FABRICOLL_SUM, 0,
                          FABRICOLL_ALGO_RING};
  /* the order of issue is the same on every rank */
  ok_call(fabricoll_iallreduce(as, ar, ca, FABRICOLL_FLOAT32, FABRICOLL_SUM, comm, &req[A]), names[A]);
  ok_call(fabricoll_iallgather(bs, br, cb, FABRICOLL_INT32, comm, &req[B]), names[B]);
  ok_call(fabricoll_ireducescatter(cs, cr, cc, FABRICOLL_FLOAT64, FABRICOLL_SUM, comm, &req[C]), names[C]);
  ok_call(fabricoll_collective(&gcall, comm, &req[D]), names[D]);
  ok_call(fabricoll_ibroadcast(ds, dr, cd, FABRICOLL_FLOAT32, rootd, comm, &req[E]), names[E]);
  ok_call(fabricoll_ireduce(es, er, ce, FABRICOLL_INT64, FABRICOLL_SUM, roote, comm, &req[F]), names[F]);
  ok_call(fabricoll_ialltoall(fs, fr, cf, FABRICOLL_INT32, comm, &req[G]), names[G]);
  int inflight = 0;
  for (int k = 0; k < NREQ; k++) inflight += req[k] != NULL;
  check(inflight == NREQ, "seven non-blocking collectives in flight at once", "%d requests", inflight);
  complete(req, names, NREQ, 4, okv);
  if (okv[A]) cmp_f(names[A], ar, aw, ca);
  if (okv[B]) cmp_i(names[B], br, bw, cb * n);
  if (okv[C]) cmp_d(names[C], cr, cw, cc);
  if (okv[D]) cmp_i(names[D], gr, gw, ca);
  if (okv[E]) cmp_f(names[E], dr, dw, cd);
  if (okv[F]) {
    if (me == roote) cmp_l(names[F], er, ew, ce);
    else check(1, names[F], NULL);
  }
  if (okv[G]) cmp_i(names[G], fr, fw, cf * n);

  { /* in-place iallreduce, completed by fabricoll_wait */
    fabricoll_request *r = NULL;
    for (size_t i = 0; i < ca; i++) as[i] = vf(me, i);
    if (ok_call(fabricoll_iallreduce(as, as, ca, FABRICOLL_FLOAT32, FABRICOLL_SUM, comm, &r), "iallreduce in place") &&
        ok_call(fabricoll_wait(r), "iallreduce in place (wait)")) {
      for (size_t i = 0; i < ca; i++) aw[i] = sum_f(n, i);
      cmp_f("iallreduce in place", as, aw, ca);
    }
    /* a completed request is gone: testing it again must fail and name the request */
    int done = 0;
    fabricoll_status s = fabricoll_test(r, &done);
    check(s != FABRICOLL_SUCCESS && strstr(fabricoll_last_error(), "request"),
          "fabricoll_test on a request already waited for fails", "status %d, \"%s\"", (int)s,
          fabricoll_last_error());
  }
  free(as), free(ar), free(aw), free(bs), free(br), free(bw), free(cs), free(cr), free(cw);
  free(gs), free(gr), free(gw), free(ds), free(dr), free(dw), free(es), free(er), free(ew);
  free(fs), free(fr), free(fw);
}

static void sendrecv(fabricoll_comm *comm) {
  const int n = g_n, me = g_rank;
  if (n < 2) return;
  int right = (me + 1) % n, left = (me + n - 1) % n;
  size_t c = 1000;
  int32_t *s = xmalloc(c * 4), *r = xmalloc(c * 4), *w = xmalloc(c * 4);
  for (size_t i = 0; i < c; i++) s[i] = me * 100000 + (int)i, r[i] = -1, w[i] = left * 100000 + (int)i;
  /* blocking: even ranks send first, odd ranks receive first (no cycle of blocked senders) */
  int ok = 1;
  if (me % 2 == 0) {
    ok = ok_call(fabricoll_send(s, c, FABRICOLL_INT32, right, comm), "send around the ring") &&
         ok_call(fabricoll_recv(r, c, FABRICOLL_INT32, left, comm), "recv around the ring");
  } else {
    ok = ok_call(fabricoll_recv(r, c, FABRICOLL_INT32, left, comm), "recv around the ring") &&
         ok_call(fabricoll_send(s, c, FABRICOLL_INT32, right, comm), "send around the ring");
  }
  if (ok) cmp_i("send/recv around the ring (blocking)", r, w, c);
  /* non-blocking: two messages each way in flight, matched in order */
  int32_t *s2 = xmalloc(c * 4), *r2 = xmalloc(c * 4), *w2 = xmalloc(c * 4);
  for (size_t i = 0; i < c; i++) {
    s[i] = me * 7 + (int)i, s2[i] = -(me * 7 + (int)i);
    r[i] = r2[i] = 0, w[i] = left * 7 + (int)i, w2[i] = -(left * 7 + (int)i);
  }
  fabricoll_request *q[4] = {0};
  ok = ok_call(fabricoll_irecv(r, c, FABRICOLL_INT32, left, comm, &q[0]), "irecv 1") &
       ok_call(fabricoll_irecv(r2, c, FABRICOLL_INT32, left, comm, &q[1]), "irecv 2") &
       ok_call(fabricoll_isend(s, c, FABRICOLL_INT32, right, comm, &q[2]), "isend 1") &
       ok_call(fabricoll_isend(s2, c, FABRICOLL_INT32, right, comm, &q[3]), "isend 2");
  for (int k = 0; k < 4; k++)
    if (q[k]) ok &= ok_call(fabricoll_wait(q[k]), "isend/irecv wait");
  if (ok) {
    cmp_i("isend/irecv around the ring, first message", r, w, c);
    cmp_i("isend/irecv around the ring, second message (in order)", r2, w2, c);
  }
  /* bad peer */
  fabricoll_status st = fabricoll_send(s, c, FABRICOLL_INT32, n, comm);
  check(st != FABRICOLL_SUCCESS && strstr(fabricoll_last_error(), "peer"), "send to peer nranks fails naming 'peer'",
        "status %d, \"%s\"", (int)st, fabricoll_last_error());
  if (me == 0) printf("rank 0:   send to peer %d: status %s, last_error \"%s\"\n", n, fabricoll_status_string((int)st), fabricoll_last_error());
  free(s), free(r), free(w), free(s2), free(r2), free(w2);
}

static void split(fabricoll_comm *comm) {
  const int n = g_n, me = g_rank;
  /* even / odd halves, key reversed: the new rank order is descending old rank */
  fabricoll_comm *half = NULL;
  if (!ok_call(fabricoll_comm_split(comm, me % 2, n - me, &half), "split even/odd")) return;
  int hs = -1, hr = -1, want_size = 0, want_rank = 0;
  for (int q = 0; q < n; q++)
    if (q % 2 == me % 2) {
      want_size++;
      if (q > me) want_rank++;
    }
  ok_call(fabricoll_comm_size(half, &hs), "split: comm_size");
  ok_call(fabricoll_comm_rank(half, &hr), "split: comm_rank");
  check(hs == want_size && hr == want_rank, "split even/odd: size and rank (key order)",
        "size %d rank %d, want %d and %d", hs, hr, want_size, want_rank);
  int32_t v = me + 1, got = -1, want = 0;
  for (int q = me % 2; q < n; q += 2) want += q + 1;
  if (ok_call(fabricoll_allreduce(&v, &got, 1, FABRICOLL_INT32, FABRICOLL_SUM, half), "split: allreduce on each half"))
    check(got == want, "split: allreduce on each half", "got %d, want %d", got, want);
  int32_t *all = xmalloc((size_t)want_size * 4), *wall = xmalloc((size_t)want_size * 4);
  int32_t mine = me;
  for (int k = 0, q = n - 1; q >= 0; q--)
    if (q % 2 == me % 2) wall[k++] = q;
  if (ok_call(fabricoll_allgather(&mine, all, 1, FABRICOLL_INT32, half), "split: allgather of old ranks"))
    cmp_i("split: allgather of old ranks (new rank order)", all, wall, (size_t)want_size);
  free(all), free(wall);
  ok_call(fabricoll_comm_destroy(half), "split: destroy half");

  /* rank 0 joins nothing (color -1): NULL newcomm; the others form one communicator */
  fabricoll_comm *rest = (fabricoll_comm *)0x1;
  if (!ok_call(fabricoll_comm_split(comm, me == 0 ? -1 : 7, 0, &rest), "split with color -1")) return;
  if (me == 0) {
    check(rest == NULL, "split color -1 gives NULL", "newcomm %p", (void *)rest);
  } else if (check(rest != NULL, "split: the others' communicator", "NULL")) {
    double x = me, y = 0, w = 0;
    for (int q = 1; q < n; q++) w += q;
    if (ok_call(fabricoll_allreduce(&x, &y, 1, FABRICOLL_FLOAT64, FABRICOLL_SUM, rest), "split: allreduce without rank 0"))
      check(y == w, "split: allreduce without rank 0", "got %g, want %g", y, w);
    ok_call(fabricoll_comm_destroy(rest), "split: destroy rest");
  }
}

static void algos(fabricoll_comm *comm) {
  const int n = g_n, me = g_rank;
  size_t c = 2500;
  float *s = xmalloc(c * 4 * n), *r = xmalloc(c * 4 * n), *w = xmalloc(c * 4 * n);
  static const struct { int algo; const char *name; } ar_algos[] = {
      {FABRICOLL_ALGO_RING, "ring"}, {FABRICOLL_ALGO_RDH, "rdh"}, {FABRICOLL_ALGO_TREE, "tree"},
      {FABRICOLL_ALGO_MESH, "mesh"}, {FABRICOLL_ALGO_AUTO, "auto"}};
  for (size_t k = 0; k < sizeof ar_algos / sizeof ar_algos[0]; k++) {
    char name[128];
    snprintf(name, sizeof name, "fabricoll_collective allreduce, per-call algo %s", ar_algos[k].name);
    for (size_t i = 0; i < c; i++) s[i] = vf(me, i + k), r[i] = -1, w[i] = sum_f(n, i + k);
    fabricoll_call call = {FABRICOLL_COLL_ALLREDUCE, s, r, c, FABRICOLL_FLOAT32, FABRICOLL_SUM, 0, ar_algos[k].algo};
    if (ok_call(fabricoll_collective(&call, comm, NULL), name)) cmp_f(name, r, w, c);
  }
  { /* allgather with bruck, broadcast with tree from the last rank */
    for (size_t i = 0; i < c; i++) s[i] = vf(me, i);
    for (size_t j = 0; j < c * n; j++) r[j] = -1, w[j] = vf((int)(j / c), j % c);
    fabricoll_call call = {FABRICOLL_COLL_ALLGATHER, s, r, c, FABRICOLL_FLOAT32, 0, 0, FABRICOLL_ALGO_BRUCK};
    if (ok_call(fabricoll_collective(&call, comm, NULL), "fabricoll_collective allgather, per-call algo bruck"))
      cmp_f("fabricoll_collective allgather, per-call algo bruck", r, w, c * n);
    for (size_t i = 0; i < c; i++) s[i] = vf(n - 1, i) + 0.5f, r[i] = -1, w[i] = vf(n - 1, i) + 0.5f;
    fabricoll_call b = {FABRICOLL_COLL_BROADCAST, me == n - 1 ? s : NULL, r, c, FABRICOLL_FLOAT32, 0, n - 1, FABRICOLL_ALGO_TREE};
    if (ok_call(fabricoll_collective(&b, comm, NULL), "fabricoll_collective broadcast, per-call algo tree"))
      cmp_f("fabricoll_collective broadcast, per-call algo tree", r, w, c);
  }
  /* the communicator's algorithm */
  if (ok_call(fabricoll_comm_set_algo(comm, FABRICOLL_ALGO_RING), "comm_set_algo ring")) {
    for (size_t i = 0; i < c; i++) s[i] = vf(me, i), r[i] = -1, w[i] = sum_f(n, i);
    if (ok_call(fabricoll_allreduce(s, r, c, FABRICOLL_FLOAT32, FABRICOLL_SUM, comm), "allreduce after set_algo ring"))
      cmp_f("allreduce after set_algo ring", r, w, c);
  }
  if (ok_call(fabricoll_comm_set_algo(comm, FABRICOLL_ALGO_MESH), "comm_set_algo mesh")) {
    size_t rc = 100;
    for (size_t j = 0; j < rc * n; j++) s[j] = vf(me, j);
    for (size_t i = 0; i < rc; i++) r[i] = -1, w[i] = sum_f(n, (size_t)me * rc + i);
    if (ok_call(fabricoll_reducescatter(s, r, rc, FABRICOLL_FLOAT32, FABRICOLL_SUM, comm), "reducescatter after set_algo mesh"))
      cmp_f("reducescatter after set_algo mesh", r, w, rc);
  }
  ok_call(fabricoll_comm_set_algo(comm, FABRICOLL_ALGO_AUTO), "comm_set_algo auto");
  free(s), free(r), free(w);
}

static void expect_error(fabricoll_status s, const char *what, const char *arg);

/* Compressed collectives through fabricoll_collective_options (the communicator compresses
 * nothing; each call asks): bf16 carries these small integer sums exactly; int8 gives one result
 * on every rank (compared through an uncompressed allgather of its bytes), within the bound of
 * docs/compression.md (about A / 127, A the sum of the ranks' block maxima; 1.02 A / 127 here
 * covers the f32 terms); calls it cannot apply to fail naming `compress`. */
static void compressed(fabricoll_comm *comm) {
  const int n = g_n, me = g_rank;
  const size_t c = 5000;
  float *s = xmalloc(c * 4), *r = xmalloc(c * 4), *w = xmalloc(c * 4), *all = xmalloc(c * 4 * n);
  for (size_t i = 0; i < c; i++) s[i] = vf(me, i), w[i] = sum_f(n, i);
  fabricoll_call_options o;
  ok_call(fabricoll_call_options_init(&o), "call_options_init");
  check(o.size == sizeof o && o.compress == FABRICOLL_COMPRESS_DEFAULT && o.compress_block == 0,
        "call_options_init sets size and defaults", "size %zu compress %d block %d", o.size, o.compress,
        o.compress_block);
  fabricoll_call call = {FABRICOLL_COLL_ALLREDUCE, s, r, c, FABRICOLL_FLOAT32, FABRICOLL_SUM, 0, 0};
  o.compress = FABRICOLL_COMPRESS_BF16;
  for (size_t i = 0; i < c; i++) r[i] = -1;
  if (ok_call(fabricoll_collective_options(&call, &o, comm, NULL), "collective_options allreduce bf16"))
    cmp_f("collective_options allreduce bf16 (small integers: exact)", r, w, c);
  o.compress = FABRICOLL_COMPRESS_INT8, o.compress_block = 128;
  for (size_t i = 0; i < c; i++) r[i] = -1;
  fabricoll_request *req = NULL;
  if (ok_call(fabricoll_collective_options(&call, &o, comm, &req), "collective_options allreduce int8, request") &&
      ok_call(fabricoll_wait(req), "wait: allreduce int8")) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < c; i++) {
      float amax = 0; /* the sum of every rank's block maximum (blocks of 128 from element 0) */
      for (int q = 0; q < n; q++) {
        float m = 0;
        for (size_t j = i / 128 * 128; j < i / 128 * 128 + 128 && j < c; j++) m = fmaxf(m, vf(q, j));
        amax += m;
      }
      if (fabsf(r[i] - w[i]) > 1.02f * amax / 127.0f && !bad++) first = i;
    }
    check(bad == 0, "collective_options allreduce int8 within the bound", "%zu of %zu beyond, first %zu: got %g, want %g",
          bad, c, first, r[first], w[first]);
    if (ok_call(fabricoll_allgather(r, all, c * 4, FABRICOLL_UINT8, comm), "allgather of the int8 results")) {
      int same = 1;
      for (int q = 0; q < n; q++) same &= memcmp(all + (size_t)q * c, r, c * 4) == 0;
      check(same, "collective_options allreduce int8: the same bits on every rank", NULL);
    }
  }
  int32_t si[16] = {0}, ri[16] = {0};
  fabricoll_call ints = {FABRICOLL_COLL_ALLREDUCE, si, ri, 16, FABRICOLL_INT32, FABRICOLL_SUM, 0, 0};
  expect_error(fabricoll_collective_options(&ints, &o, comm, NULL), "collective_options int8 on int32", "compress");
  call.op = FABRICOLL_MAX;
  expect_error(fabricoll_collective_options(&call, &o, comm, NULL), "collective_options int8 with op max", "compress");
  o.compress = 42;
  expect_error(fabricoll_collective_options(&call, &o, comm, NULL), "collective_options compress 42", "options.compress");
  free(s), free(r), free(w), free(all);
}

/* An error path: status must be non-zero and last_error must contain `arg`. */
static void expect_error(fabricoll_status s, const char *what, const char *arg) {
  const char *e = fabricoll_last_error();
  char name[200];
  snprintf(name, sizeof name, "error path: %s -> names '%s'", what, arg);
  if (g_rank == 0)
    printf("rank 0:   %-44s status %d (%s), last_error \"%s\"\n", what, (int)s,
           fabricoll_status_string((int)s), e ? e : "(null)");
  check(s != FABRICOLL_SUCCESS && e && strstr(e, arg) != NULL, name, "status %d, last_error \"%s\"",
        (int)s, e ? e : "(null)");
}

static void errors(fabricoll_comm *comm) {
  const int n = g_n;
  float s[16] = {0}, r[16 * MAX_RANKS] = {0};
  fabricoll_comm *garbage = (fabricoll_comm *)(uintptr_t)0x1234;
  expect_error(fabricoll_allreduce(s, r, 16, FABRICOLL_FLOAT32, FABRICOLL_SUM, NULL), "allreduce, NULL comm", "comm");
  expect_error(fabricoll_allreduce(s, r, 16, FABRICOLL_FLOAT32, FABRICOLL_SUM, garbage), "allreduce, comm 0x1234", "comm");
  expect_error(fabricoll_comm_size(garbage, &(int){0}), "comm_size, comm 0x1234", "comm");
  expect_error(fabricoll_allreduce(s, r, 16, 99, FABRICOLL_SUM, comm), "allreduce, datatype 99", "datatype");
  expect_error(fabricoll_allreduce(s, r, 16, -1, FABRICOLL_SUM, comm), "allreduce, datatype -1", "datatype");
  expect_error(fabricoll_allreduce(s, r, 16, FABRICOLL_FLOAT32, 99, comm), "allreduce, op 99", "op");
  expect_error(fabricoll_reducescatter(s, r, 1, FABRICOLL_FLOAT32, 5, comm), "reducescatter, op 5", "op");
  expect_error(fabricoll_broadcast(s, r, 16, FABRICOLL_FLOAT32, n, comm), "broadcast, root = nranks", "root");
  expect_error(fabricoll_reduce(s, r, 16, FABRICOLL_FLOAT32, FABRICOLL_SUM, -1, comm), "reduce, root -1", "root");
  expect_error(fabricoll_allreduce(NULL, r, 16, FABRICOLL_FLOAT32, FABRICOLL_SUM, comm), "allreduce, NULL sendbuf, count 16", "sendbuf");
  expect_error(fabricoll_allreduce(s, NULL, 16, FABRICOLL_FLOAT32, FABRICOLL_SUM, comm), "allreduce, NULL recvbuf, count 16", "recvbuf");
  expect_error(fabricoll_allgather(NULL, r, 4, FABRICOLL_FLOAT32, comm), "allgather, NULL sendbuf", "sendbuf");
  {
    fabricoll_request *q = (fabricoll_request *)0x1;
    fabricoll_status st = fabricoll_iallreduce(s, r, 16, 99, FABRICOLL_SUM, comm, &q);
    expect_error(st, "iallreduce, datatype 99", "datatype");
    check(q == NULL, "error path: failed iallreduce sets *request = NULL", "request %p", (void *)q);
    expect_error(fabricoll_iallreduce(s, r, 16, FABRICOLL_FLOAT32, FABRICOLL_SUM, comm, NULL), "iallreduce, NULL request", "request");
  }
  fabricoll_call bad = {FABRICOLL_COLL_ALLREDUCE, s, r, 16, FABRICOLL_FLOAT32, FABRICOLL_SUM, 0, 99};
  expect_error(fabricoll_collective(&bad, comm, NULL), "collective, algo 99", "algo");
  bad.algo = FABRICOLL_ALGO_AUTO, bad.coll = 42;
  expect_error(fabricoll_collective(&bad, comm, NULL), "collective, coll 42", "coll");
  expect_error(fabricoll_collective(NULL, comm, NULL), "collective, NULL call", "call");
  expect_error(fabricoll_comm_set_algo(comm, 99), "comm_set_algo 99", "algo");
  expect_error(fabricoll_comm_rank(comm, NULL), "comm_rank, NULL rank", "rank");
  expect_error(fabricoll_test(NULL, &(int){0}), "test, NULL request", "request");
  expect_error(fabricoll_wait((fabricoll_request *)(uintptr_t)0x1234), "wait, request 0x1234", "request");
  {
    fabricoll_comm *c2 = (fabricoll_comm *)0x1;
    expect_error(fabricoll_comm_init_rank(&c2, n, NULL, g_rank), "comm_init_rank, NULL id", "id");
    check(c2 == NULL, "error path: failed init_rank sets *comm = NULL", "comm %p", (void *)c2);
  }
  /* fabricoll_comm_init_env: a NULL out-pointer is named (the launcher recipes are in the
   * function's comment in include/fabricoll.h; tests/launchers.rs runs it under srun's variables) */
  expect_error(fabricoll_comm_init_env(NULL), "comm_init_env, NULL comm", "comm");
  check(fabricoll_status_string(FABRICOLL_INVALID_ARGUMENT) && *fabricoll_status_string(FABRICOLL_INVALID_ARGUMENT),
        "status_string", NULL);
  /* after all that, the communicator still works */
  allreduce_float_sum(comm, 333, "allreduce after the error paths");
}

static void abort_and_destroy(fabricoll_comm *comm) {
  /* a duplicate (every rank color 0), aborted: later calls on it fail, destroy succeeds */
  fabricoll_comm *dup = NULL;
  if (ok_call(fabricoll_comm_split(comm, 0, g_rank, &dup), "split: duplicate")) {
    /* a request started before the abort: wait names the abort (INVALID_USAGE) on any number of
     * ranks, whether or not the collective had finished */
    float ia = 1, ib = 0;
    fabricoll_request *req = NULL;
    int started = ok_call(fabricoll_iallreduce(&ia, &ib, 1, FABRICOLL_FLOAT32, FABRICOLL_SUM, dup, &req),
                          "iallreduce before abort");
    ok_call(fabricoll_comm_abort(dup), "comm_abort");
    if (started) {
      fabricoll_status w = fabricoll_wait(req);
      check(w == FABRICOLL_INVALID_USAGE && strstr(fabricoll_last_error(), "aborted") != NULL,
            "wait after abort: INVALID_USAGE naming the abort", "status %d, \"%s\"", (int)w,
            fabricoll_last_error());
    }
    float a = 1, b = 0;
    fabricoll_status s = fabricoll_allreduce(&a, &b, 1, FABRICOLL_FLOAT32, FABRICOLL_SUM, dup);
    check(s != FABRICOLL_SUCCESS, "allreduce on an aborted communicator fails", "status %d", (int)s);
    if (g_rank == 0)
      printf("rank 0:   allreduce after abort: status %d (%s), last_error \"%s\"\n", (int)s,
             fabricoll_status_string((int)s), fabricoll_last_error());
    ok_call(fabricoll_comm_destroy(dup), "destroy the aborted communicator");
  }
  ok_call(fabricoll_comm_destroy(comm), "comm_destroy");
  int sz = 0;
  expect_error(fabricoll_comm_size(comm, &sz), "comm_size after destroy", "comm");
  expect_error(fabricoll_comm_destroy(comm), "comm_destroy twice", "comm");
}

static int header_check(void) {
#ifdef CAPI_ENUM_FALLBACK
  return check(0, "include/fabricoll.h defines the datatype/op/algo/coll enums",
               "FABRICOLL_FLOAT32, FABRICOLL_SUM, FABRICOLL_ALGO_RING, FABRICOLL_COLL_ALLREDUCE ... are "
               "missing from the header (cbindgen exports only fabricoll_status); this program used "
               "the values of src/ffi/api/types.rs");
#else
  return check(FABRICOLL_FLOAT32 == 7 && FABRICOLL_AVG == 4 && FABRICOLL_ALGO_HIER == 11 &&
                   FABRICOLL_COLL_ALLTOALL == 5,
               "include/fabricoll.h defines the datatype/op/algo/coll enums", "unexpected values");
#endif
}

/* Rank 0 makes the unique id and publishes it; the others wait for it (up to deadline). */
static int share_id(struct idbox *box, fabricoll_unique_id *id, double deadline) {
  if (g_rank == 0) {
    int ok = ok_call(fabricoll_get_unique_id(id), "get_unique_id");
    if (ok) memcpy(&box->id, id, sizeof *id);
    __atomic_store_n(&box->ready, ok ? 1 : -1, __ATOMIC_RELEASE);
    return ok ? 0 : -1;
  }
  while (now_s() < deadline) {
    int r = __atomic_load_n(&box->ready, __ATOMIC_ACQUIRE);
    if (r == 1) {
      memcpy(id, &box->id, sizeof *id);
      return 0;
    }
    if (r < 0) return check(0, "get_unique_id", "rank 0 could not make the unique id"), -1;
    usleep(1000);
  }
  return check(0, "get_unique_id", "rank 0 did not publish the unique id in time"), -1;
}

static int rank_main(struct idbox *box, double deadline) {
  fabricoll_comm *comm = NULL;
  double t0 = now_s();
  fabricoll_unique_id id;
  if (share_id(box, &id, deadline)) return 1;
  if (!ok_call(fabricoll_comm_init_rank(&comm, g_n, &id, g_rank), "comm_init_rank")) return 1;
  check(1, "comm_init_rank", NULL);
  int r = -1, s = -1;
  ok_call(fabricoll_comm_rank(comm, &r), "comm_rank");
  ok_call(fabricoll_comm_size(comm, &s), "comm_size");
  check(r == g_rank && s == g_n, "comm_rank / comm_size", "rank %d size %d", r, s);
  if (g_rank == 0) header_check();
  blocking(comm);
  nonblocking(comm);
  sendrecv(comm);
  if (g_n >= 2) split(comm);
  algos(comm);
  compressed(comm);
  errors(comm);
  abort_and_destroy(comm);
  if (g_verbose || g_rank == 0) printf("rank %d: done in %.2f s\n", g_rank, now_s() - t0);
  return g_slot->fail ? 1 : 0;
}

int main(int argc, char **argv) {
  int n = 4;
  double timeout_s = 180;
  g_verbose = getenv("CAPI_VERBOSE") && atoi(getenv("CAPI_VERBOSE"));
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-n") && i + 1 < argc) n = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-t") && i + 1 < argc) timeout_s = atof(argv[++i]);
    else if (!strcmp(argv[i], "-v")) g_verbose = 1;
    else {
      fprintf(stderr, "usage: %s [-n NRANKS (1..%d, default 4)] [-t TIMEOUT_S (180)] [-v]\n", argv[0], MAX_RANKS);
      return 2;
    }
  }
  if (n < 1 || n > MAX_RANKS) {
    fprintf(stderr, "capi_example: -n must be 1..%d\n", MAX_RANKS);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("capi_example: fabricoll %s, %d ranks, provider %s\n", fabricoll_version(), n,
         getenv("FABRICOLL_PROVIDER") ? getenv("FABRICOLL_PROVIDER") : "(default)");

  size_t map_len = sizeof(struct slot) * (MAX_RANKS + 1) + sizeof(struct idbox);
  void *map = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  memset(map, 0, map_len);
  struct slot *slots = map;
  struct idbox *box = (struct idbox *)(slots + MAX_RANKS + 1);
  /* the parent's own checks go to slot MAX_RANKS */
  g_rank = -1, g_n = n, g_slot = &slots[MAX_RANKS];
  fflush(stdout);
  /* a closed stdout (e.g. `| head`) must not kill the parent before it has reaped the ranks */
  signal(SIGPIPE, SIG_IGN);
  pid_t parent = getpid();
  pid_t pids[MAX_RANKS];
  for (int r = 0; r < n; r++) {
    pid_t p = fork();
    if (p < 0) {
      perror("fork");
      for (int k = 0; k < r; k++) kill(pids[k], SIGKILL);
      return 1;
    }
    if (p == 0) {
      /* a rank never outlives the parent (killed by `timeout`, crashed): no orphans */
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(4);
      g_rank = r, g_slot = &slots[r];
      int rc = rank_main(box, now_s() + timeout_s);
      g_slot->finished = 1;
      fflush(stdout);
      _exit(rc); /* never run the parent's atexit handlers in a rank */
    }
    pids[r] = p;
  }

  /* wait for every rank, with a deadline; then kill what is left */
  int alive = n, status[MAX_RANKS];
  int exited[MAX_RANKS] = {0};
  double deadline = now_s() + timeout_s;
  while (alive > 0 && now_s() < deadline) {
    for (int r = 0; r < n; r++) {
      if (exited[r]) continue;
      pid_t w = waitpid(pids[r], &status[r], WNOHANG);
      if (w == pids[r] || (w < 0 && errno == ECHILD)) exited[r] = 1, alive--;
    }
    if (alive > 0) usleep(20000);
  }
  /* kill what is left before printing anything */
  for (int r = 0; r < n; r++)
    if (!exited[r]) kill(pids[r], SIGKILL);
  for (int r = 0; r < n; r++)
    if (!exited[r]) waitpid(pids[r], &status[r], 0);
  int pass = slots[MAX_RANKS].pass, fail = slots[MAX_RANKS].fail;
  for (int r = 0; r < n; r++) {
    if (!exited[r]) {
      printf("FAIL rank %d: still running after %g s (-t): killed\n", r, timeout_s);
      fail++;
    } else if (WIFSIGNALED(status[r])) {
      printf("FAIL rank %d: killed by signal %d\n", r, WTERMSIG(status[r]));
      fail++;
    } else if (!slots[r].finished) {
      printf("FAIL rank %d: exited with %d before finishing\n", r, WEXITSTATUS(status[r]));
      fail++;
    } else if (WEXITSTATUS(status[r]) != 0 && slots[r].fail == 0) {
      printf("FAIL rank %d: exit status %d without a failed check\n", r, WEXITSTATUS(status[r]));
      fail++;
    }
    pass += slots[r].pass;
    fail += slots[r].fail;
  }
  printf("capi_example: %d passed, %d failed\n", pass, fail);
  return fail ? 1 : 0;
}
