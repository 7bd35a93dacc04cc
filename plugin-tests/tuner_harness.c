/*
 * tuner_harness.c: plays NCCL's tuner loader against the fabricoll library. It dlopens the
 * library, looks up ncclTunerPlugin_v6 .. _v2 as NCCL does, checks each table's layout (the
 * declarations below, written from docs/nccl-abi.md, "The tuner", against the exported
 * symbol's size), runs init for 1 to 64 nodes, getCollInfo for every ncclFunc_t and sizes
 * 1 B .. 1 GiB on NCCL-like cost tables (with -1 cells), getChunkSize (v6) and
 * finalize/destroy, and asserts that:
 *   - -1 cells never change, and no cell outside COLLNET_DIRECT/CHAIN x SIMPLE ever changes;
 *   - CollNet's usable cells of AllReduce/AllGather/ReduceScatter get a price >= 0 from 2
 *     nodes on, and stay NCCL's for 1 node and for every other collective;
 *   - v3, v4 and v5 (NCCL's chunks) price alike, and a second call prices as the first;
 *   - getCollInfo and getChunkSize always return ncclSuccess, even on bad arguments;
 *   - each decision is logged once per (collective, power-of-two size class);
 *   - with --off (run under FABRICOLL_TUNER=0) nothing changes at all.
 * Prints "tuner-harness: N passed, M failed" and exits non-zero on any failure.
 *
 *   tuner_harness [--lib PATH] [--off]     (PATH default: $FABRICOLL_LIB)
 */
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int ncclResult_t;
typedef int ncclFunc_t;
typedef void (*ncclDebugLogger_t)(int level, unsigned long flags, const char *file, int line,
                                  const char *fmt, ...);

typedef struct {
  int nNvlDomains, minRanksPerNvlDomain, maxRanksPerNvlDomain;
} nvlDomainInfo_v5;

typedef struct {
  double baseLatencies[7][3];
  double hwLatencies[3][7][3];
  double llMaxBws[4][3];
  double perChMaxRingLL128Bws[4][3];
  double perChMaxTreeLL128Bws[4][3];
  double perChMaxTreeBws[4][3];
  double perChMaxNVLSTreeBws[4][3];
} tunerConstants_v5;

typedef ncclResult_t (*initV2_t)(size_t nRanks, size_t nNodes, ncclDebugLogger_t log, void **ctx);
typedef ncclResult_t (*initV5_t)(void **ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                                 ncclDebugLogger_t log, nvlDomainInfo_v5 *nvl,
                                 tunerConstants_v5 *constants);
typedef ncclResult_t (*collInfoV4_t)(void *ctx, ncclFunc_t f, size_t nBytes, int numPipeOps,
                                     float **table, int numAlgo, int numProto, int regBuff,
                                     int *nChannels);
typedef ncclResult_t (*closeT)(void *ctx);

typedef struct {
  const char *name;
  initV2_t init;
  ncclResult_t (*getCollInfo)(void *ctx, ncclFunc_t f, size_t nBytes, int collNetSupport,
                              int nvlsSupport, int numPipeOps, int *algorithm, int *protocol,
                              int *nChannels);
  closeT destroy;
} tuner_v2;

typedef struct {
  const char *name;
  initV2_t init;
  ncclResult_t (*getCollInfo)(void *ctx, ncclFunc_t f, size_t nBytes, int numPipeOps,
                              float **table, int numAlgo, int numProto, int *nChannels);
  closeT destroy;
} tuner_v3;

typedef struct {
  const char *name;
  initV2_t init;
  collInfoV4_t getCollInfo;
  closeT destroy;
} tuner_v4;

typedef struct {
  const char *name;
  initV5_t init;
  collInfoV4_t getCollInfo;
  closeT finalize;
} tuner_v5;

typedef struct {
  const char *name;
  initV5_t init;
  collInfoV4_t getCollInfo;
  closeT finalize;
  ncclResult_t (*getChunkSize)(void *ctx, ncclFunc_t f, size_t nBytes, int algo, int proto,
                               int nChannels, size_t *chunkSize);
} tuner_v6;

_Static_assert(sizeof(nvlDomainInfo_v5) == 12, "ncclNvlDomainInfo_v5_t");
_Static_assert(sizeof(tunerConstants_v5) == 1152, "ncclTunerConstants_v5_t");
_Static_assert(offsetof(tunerConstants_v5, llMaxBws) == 672, "llMaxBws");
_Static_assert(offsetof(tunerConstants_v5, perChMaxNVLSTreeBws) == 1056, "perChMaxNVLSTreeBws");
_Static_assert(sizeof(tuner_v2) == 32 && offsetof(tuner_v2, destroy) == 24, "ncclTuner_v2_t");
_Static_assert(sizeof(tuner_v3) == 32 && offsetof(tuner_v3, getCollInfo) == 16, "ncclTuner_v3_t");
_Static_assert(sizeof(tuner_v4) == 32, "ncclTuner_v4_t");
_Static_assert(sizeof(tuner_v5) == 32 && offsetof(tuner_v5, finalize) == 24, "ncclTuner_v5_t");
_Static_assert(sizeof(tuner_v6) == 40 && offsetof(tuner_v6, getChunkSize) == 32, "ncclTuner_v6_t");

enum { NALGO = 7, NPROTO = 3, DIRECT = 2, CHAIN = 3, SIMPLE = 2 };
#define IGNORE (-1.0f)
#define MIN_CHUNK (32u << 10)
#define MAX_CHUNK (512u << 10)
#define NSIZES 61

static int passed, failed, off;
static int decision_lines;

#define CHECK(cond, ...)                                                                       \
  do {                                                                                         \
    if (cond) {                                                                                \
      passed++;                                                                                \
    } else {                                                                                   \
      failed++;                                                                                \
      if (failed <= 30) {                                                                      \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
        fprintf(stderr, __VA_ARGS__);                                                          \
        fputc('\n', stderr);                                                                   \
      }                                                                                        \
    }                                                                                          \
  } while (0)

/* NCCL's logger: counts the tuner's decision lines (and prints them with HARNESS_VERBOSE). */
static void logger(int level, unsigned long flags, const char *file, int line, const char *fmt,
                   ...) {
  char buf[2048];
  va_list ap;
  (void)flags;
  (void)file;
  (void)line;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (strstr(buf, "tuner: ") && strstr(buf, "(class 2^")) decision_lines++;
  if (getenv("HARNESS_VERBOSE")) fprintf(stderr, "[%d] %s\n", level, buf);
}

static int collnet_func(int f) { return f == 2 || f == 3 || f == 4; }

/* Sizes 1 B .. 1 GiB: each power of two and an odd size of the same class. */
static size_t sizes[NSIZES];
static void make_sizes(void) {
  int n = 0;
  for (int k = 0; k <= 30; k++) {
    sizes[n++] = (size_t)1 << k;
    if (k < 30) sizes[n++] = ((size_t)1 << k) + ((size_t)1 << k) / 3 + 1;
  }
}

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

/* An NCCL-like table: latency plus bytes over bandwidth, CollNet only with SIMPLE, NVLS and
 * PAT off, and a random fifth of the rest -1. */
static void nccl_table(float t[NALGO][NPROTO], size_t nbytes, size_t nodes) {
  for (int a = 0; a < NALGO; a++)
    for (int p = 0; p < NPROTO; p++) {
      double lat = (6.0 + 4.0 * p) * (1.0 + a / 4.0) * (nodes > 1 ? log2((double)nodes) : 1.0);
      double bw = (2.0e3 + 4.0e3 * p) / (1.0 + a / 7.0);
      t[a][p] = (float)(lat + (double)nbytes / bw);
      int forbidden = ((a == DIRECT || a == CHAIN) && p != SIMPLE) || a >= 4;
      if (forbidden || next_rand() % 5 == 0) t[a][p] = IGNORE;
    }
}

/* Check one call's effect: before -> after for func f on `nodes` nodes. */
static void check_table(const char *v, float before[NALGO][NPROTO], float after[NALGO][NPROTO],
                        int f, size_t nbytes, size_t nodes) {
  int priced = !off && nodes >= 2 && collnet_func(f);
  int bad = 0;
  for (int a = 0; a < NALGO; a++)
    for (int p = 0; p < NPROTO; p++) {
      int ours = priced && (a == DIRECT || a == CHAIN) && p == SIMPLE && before[a][p] >= 0;
      if (!ours) {
        if (memcmp(&before[a][p], &after[a][p], sizeof(float)) != 0) {
          CHECK(0, "%s func %d %zu B %zu nodes: cell %d/%d changed %g -> %g%s", v, f, nbytes,
                nodes, a, p, before[a][p], after[a][p], before[a][p] < 0 ? " (a -1 cell)" : "");
          bad = 1;
        }
      } else if (!(after[a][p] >= 0 && isfinite(after[a][p]))) {
        CHECK(0, "%s func %d %zu B %zu nodes: CollNet cell %d priced %g", v, f, nbytes, nodes,
              a, after[a][p]);
        bad = 1;
      }
    }
  if (!bad) passed++;
}

/* getCollInfo of one table version through `call`, returning NCCL's table after it. */
typedef ncclResult_t (*collCall)(void *tbl, void *ctx, int f, size_t n, float **t);
static ncclResult_t call_v3(void *tbl, void *ctx, int f, size_t n, float **t) {
  int nch = 0;
  ncclResult_t r = ((tuner_v3 *)tbl)->getCollInfo(ctx, f, n, 1, t, NALGO, NPROTO, &nch);
  CHECK(nch == 0, "v3 wrote nChannels %d", nch);
  return r;
}
static ncclResult_t call_v4(void *tbl, void *ctx, int f, size_t n, float **t) {
  int nch = 0;
  ncclResult_t r = ((tuner_v4 *)tbl)->getCollInfo(ctx, f, n, 1, t, NALGO, NPROTO, 0, &nch);
  CHECK(nch == 0, "v4 wrote nChannels %d", nch);
  return r;
}
static ncclResult_t call_v56(void *tbl, void *ctx, int f, size_t n, float **t) {
  int nch = 0;
  ncclResult_t r = ((tuner_v5 *)tbl)->getCollInfo(ctx, f, n, 2, t, NALGO, NPROTO, 1, &nch);
  CHECK(nch == 0, "v5/v6 wrote nChannels %d", nch);
  return r;
}

/* Run every func and size through contexts of versions v3..v6 on `nodes` nodes. */
static void sweep(void *t[7], size_t nodes, size_t ranks_per_node) {
  void *ctx[7] = {0};
  tunerConstants_v5 consts;
  nvlDomainInfo_v5 nvl = {(int)nodes, (int)ranks_per_node, (int)ranks_per_node};
  size_t nranks = nodes * ranks_per_node;
  memset(&consts, 0, sizeof consts);
  consts.baseLatencies[1][2] = 8.4;
  CHECK(((tuner_v3 *)t[3])->init(nranks, nodes, logger, &ctx[3]) == 0 && ctx[3], "v3 init");
  CHECK(((tuner_v4 *)t[4])->init(nranks, nodes, logger, &ctx[4]) == 0 && ctx[4], "v4 init");
  CHECK(((tuner_v5 *)t[5])->init(&ctx[5], 5, nranks, nodes, logger, &nvl, &consts) == 0 && ctx[5],
        "v5 init");
  CHECK(((tuner_v6 *)t[6])->init(&ctx[6], 6, nranks, nodes, logger, NULL, &consts) == 0 && ctx[6],
        "v6 init");
  CHECK(consts.baseLatencies[1][2] == 8.4, "init changed NCCL's constants");
  collCall calls[7] = {0, 0, 0, call_v3, call_v4, call_v56, call_v56};
  const char *names[7] = {0, 0, 0, "v3", "v4", "v5", "v6"};
  for (int f = 0; f <= 15; f++) {
    for (int s = 0; s < NSIZES; s++) {
      if (!collnet_func(f) && s % 10 != 0) continue; /* a few sizes for the others */
      float before[NALGO][NPROTO], after[7][NALGO][NPROTO];
      nccl_table(before, sizes[s], nodes);
      for (int v = 3; v <= 6; v++) {
        if (!ctx[v]) continue;
        memcpy(after[v], before, sizeof before);
        ncclResult_t r = calls[v](t[v], ctx[v], f, sizes[s], (float **)after[v]);
        CHECK(r == 0, "%s getCollInfo returned %d", names[v], r);
        check_table(names[v], before, after[v], f, sizes[s], nodes);
      }
      /* v3, v4 and v5 price with NCCL's chunks: alike. A second call prices as the first. */
      if (ctx[3] && ctx[4] && ctx[5])
        CHECK(!memcmp(after[3], after[4], sizeof before) && !memcmp(after[4], after[5], sizeof before),
              "func %d %zu B %zu nodes: v3, v4 and v5 disagree", f, sizes[s], nodes);
      if (ctx[6]) {
        float again[NALGO][NPROTO];
        memcpy(again, before, sizeof before);
        call_v56(t[6], ctx[6], f, sizes[s], (float **)again);
        CHECK(!memcmp(again, after[6], sizeof again), "v6 func %d %zu B: two calls differ", f,
              sizes[s]);
        tuner_v6 *t6 = t[6];
        for (int a = 0; a < NALGO; a++) {
          size_t chunk = 12345;
          CHECK(t6->getChunkSize(ctx[6], f, sizes[s], a, SIMPLE, 4, &chunk) == 0, "getChunkSize");
          int ours = !off && nodes >= 2 && collnet_func(f) && (a == DIRECT || a == CHAIN);
          if (ours)
            CHECK(chunk >= MIN_CHUNK && chunk <= MAX_CHUNK && (chunk & (chunk - 1)) == 0,
                  "func %d %zu B algo %d: chunk %zu", f, sizes[s], a, chunk);
          else
            CHECK(chunk == 12345, "func %d %zu B algo %d: chunk %zu changed", f, sizes[s], a,
                  chunk);
        }
        size_t ll = 777;
        CHECK(t6->getChunkSize(ctx[6], f, sizes[s], DIRECT, 0, 4, &ll) == 0 && ll == 777,
              "getChunkSize changed LL's chunk");
      }
    }
  }
  CHECK(((tuner_v3 *)t[3])->destroy(ctx[3]) == 0, "v3 destroy");
  CHECK(((tuner_v4 *)t[4])->destroy(ctx[4]) == 0, "v4 destroy");
  CHECK(((tuner_v5 *)t[5])->finalize(ctx[5]) == 0, "v5 finalize");
  CHECK(((tuner_v6 *)t[6])->finalize(ctx[6]) == 0, "v6 finalize");
  CHECK(((tuner_v6 *)t[6])->finalize(ctx[6]) != 0, "v6 finalize of a closed context succeeded");
}

/* The symbol's size in the library: each table must be exactly the size NCCL reads. */
static size_t symbol_size(void *p) {
  Dl_info info;
  const ElfW(Sym) *sym = NULL;
  if (!dladdr1(p, &info, (void **)&sym, RTLD_DL_SYMENT) || !sym) return 0;
  return sym->st_size;
}

static void bad_arguments(tuner_v6 *t6, tuner_v2 *t2) {
  void *ctx = NULL, *garbage = (void *)(uintptr_t)0xdeadb0b0;
  float table[NALGO][NPROTO];
  int nch = 0, algo = -1, proto = -1;
  size_t chunk = 99;
  nccl_table(table, 1024, 4);
  CHECK(t6->init(NULL, 1, 4, 4, NULL, NULL, NULL) != 0, "init with a NULL context succeeded");
  CHECK(t2->init(4, 4, NULL, NULL) != 0, "v2 init with a NULL context succeeded");
  CHECK(t6->getCollInfo(garbage, 4, 1024, 1, (float **)table, NALGO, NPROTO, 0, &nch) == 0,
        "getCollInfo on an unknown context must still succeed");
  CHECK(t6->getChunkSize(garbage, 4, 1024, DIRECT, SIMPLE, 1, &chunk) == 0 && chunk == 99,
        "getChunkSize on an unknown context");
  CHECK(t6->init(&ctx, 1, 4, 4, NULL, NULL, NULL) == 0 && ctx, "init");
  CHECK(t6->getCollInfo(ctx, 4, 1024, 1, NULL, NALGO, NPROTO, 0, &nch) == 0, "NULL table");
  CHECK(t6->getCollInfo(ctx, 4, 1024, 1, (float **)table, -1, NPROTO, 0, &nch) == 0,
        "negative numAlgo");
  CHECK(t6->getChunkSize(ctx, 4, 1024, DIRECT, SIMPLE, 1, NULL) == 0, "NULL chunkSize");
  CHECK(t6->finalize(garbage) != 0, "finalize of an unknown context succeeded");
  CHECK(t6->finalize(ctx) == 0, "finalize");
  /* v2: NCCL gives no estimates, so the outputs stay NCCL's (-1: its own choice). */
  CHECK(t2->init(8, 4, NULL, &ctx) == 0 && ctx, "v2 init");
  for (int f = 0; f <= 15; f++)
    for (int s = 0; s < NSIZES; s += 5) {
      algo = proto = -1;
      nch = 0;
      CHECK(t2->getCollInfo(ctx, f, sizes[s], 1, 0, 1, &algo, &proto, &nch) == 0 && algo == -1 &&
                proto == -1 && nch == 0,
            "v2 func %d changed its outputs", f);
    }
  CHECK(t2->destroy(ctx) == 0, "v2 destroy");
}

int main(int argc, char **argv) {
  const char *lib = getenv("FABRICOLL_LIB");
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--lib") && i + 1 < argc) lib = argv[++i];
    else if (!strcmp(argv[i], "--off")) off = 1;
    else {
      fprintf(stderr, "usage: %s [--lib PATH] [--off]\n", argv[0]);
      return 2;
    }
  }
  if (!lib) {
    fprintf(stderr, "tuner-harness: no library: pass --lib PATH or set FABRICOLL_LIB\n");
    return 2;
  }
  make_sizes();
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  CHECK(h != NULL, "dlopen %s: %s", lib, dlerror());
  if (!h) goto out;
  void *t[7] = {0};
  static const size_t want[7] = {0, 0, sizeof(tuner_v2), sizeof(tuner_v3), sizeof(tuner_v4),
                                 sizeof(tuner_v5), sizeof(tuner_v6)};
  /* NCCL tries v6 first, then older ones; we look up all of them. */
  for (int v = 6; v >= 2; v--) {
    char name[32];
    snprintf(name, sizeof name, "ncclTunerPlugin_v%d", v);
    t[v] = dlsym(h, name);
    CHECK(t[v] != NULL, "%s not found", name);
    if (!t[v]) goto out;
    CHECK(symbol_size(t[v]) == want[v], "%s: %zu bytes, NCCL reads %zu", name,
          symbol_size(t[v]), want[v]);
    const char *n = ((tuner_v2 *)t[v])->name; /* every version starts with name, init */
    CHECK(n && !strcmp(n, "fabricoll"), "%s: name %s", name, n ? n : "(null)");
    void *const *slots = (void *const *)t[v];
    size_t nslots = want[v] / sizeof(void *);
    for (size_t k = 1; k < nslots; k++) CHECK(slots[k] != NULL, "%s: slot %zu is NULL", name, k);
  }
  /* init with 1 to 64 nodes, one rank per node (CollNet's AllGather / ReduceScatter need
   * that) and eight per node at a few counts. */
  for (size_t nodes = 1; nodes <= 64; nodes++) {
    sweep(t, nodes, 1);
    if (nodes == 2 || nodes == 5 || nodes == 64) sweep(t, nodes, 8);
  }
  /* Decisions are logged once per collective and size class, per communicator. */
  decision_lines = 0;
  {
    void *ctx = NULL;
    tuner_v6 *t6 = t[6];
    CHECK(t6->init(&ctx, 9, 4, 4, logger, NULL, NULL) == 0, "init");
    for (int round = 0; round < 2; round++)
      for (int f = 0; f <= 15; f++)
        for (int s = 0; s < NSIZES; s++) {
          float table[NALGO][NPROTO];
          nccl_table(table, sizes[s], 4);
          table[DIRECT][SIMPLE] = 50.0f; /* CollNet usable: a decision to log */
          call_v56(t6, ctx, f, sizes[s], (float **)table);
        }
    t6->finalize(ctx);
    int want_lines = off ? 0 : 3 * 31;
    if (getenv("FABRICOLL_LOG") && strcmp(getenv("FABRICOLL_LOG"), "info") != 0)
      want_lines = decision_lines; /* another log level: not checked */
    CHECK(decision_lines == want_lines, "%d decision lines logged, expected %d", decision_lines,
          want_lines);
  }
  bad_arguments(t[6], t[2]);
out:
  printf("tuner-harness: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
