/*
 * collnet_harness: multi-process conformance tests and a benchmark for an NCCL CollNet plugin
 * (ncclCollNetPlugin_v6..v12), written for fabricoll.
 *
 *   collnet_harness --lib PATH [--scenario NAME[,NAME...]|all] [--skip NAME[,...]] [--ranks N[,N...]]
 *                   [--version 6..12] [--op-timeout-ms 60000] [--kill-timeout-ms 3000]
 *                   [--time-scale 1.0] [--list]
 *   collnet_harness --lib PATH --bench [--ranks R] [-b 64K] [-e 64M] [-f 2] [-n 20] [-w 5]
 *                   [--version 12] [-c 1]
 *
 * Process model (as net_harness): the parent never dlopens the plugin. For each scenario and rank
 * count it maps an anonymous MAP_SHARED region, forks the ranks, and each rank dlopens the plugin
 * itself. Every rank plays one CollNet "head" of NCCL (doc section 6): listen, all-gather the
 * 128-byte handles through the mapping, connect(handles[], nranks, rank, listenComm, &collComm) in
 * ONE call, closeListen. Ranks synchronise by polling the mapping with deadlines; nothing blocks
 * on a dead process, and the parent kills what is left at the scenario's deadline (with gdb
 * stacks of a hung rank when gdb is installed; HARNESS_NO_STACKS=1 turns that off).
 *
 * Without --ranks each scenario runs for 2, 3, 4 and 5 ranks (kill: 4 ranks only); --ranks 2,5 picks
 * rank counts (kill still 4); a single --ranks N runs every scenario with N ranks. Output:
 *   PASS <scenario> np<N> (details; seconds)     or     FAIL <scenario> np<N>: reason
 * then "collnet_harness: N passed, M failed" (exit status 1 on any failure).
 *
 * Environment: FABRICOLL_* pass through to the plugin, except that the kill ranks get
 * FABRICOLL_TIMEOUT_MS=<--kill-timeout-ms>. HARNESS_VERBOSE=1 prints progress and plugin logs.
 *
 * This file holds the command line, the scenario table, the parent's loop and the bench table;
 * collnet_harness.h what the parts share, collnet_table.c the CollNet tables, collnet_data.c the
 * data types and reference results, collnet_util.c the ranks' helpers, collnet_scn_*.c the
 * scenarios and collnet_bench.c the bench ranks.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "collnet_harness.h"

/* ------------------------------------------------------------------------------ configuration */

const char* g_lib;
int g_version = 12;
int g_op_timeout_ms = 60000;
int g_kill_timeout_ms = 3000;
double g_time_scale = 1.0;
int g_kill_victim = 2;     /* set by the parent before forking the kill ranks */
int g_print_matrix = 1;    /* support: rank 0 prints the table (first run only) */

size_t g_bmin = 64 << 10, g_bmax = 64 << 20, g_bfactor = 2;
int g_biters = 20, g_bwarm = 5, g_bcheck = 1;
size_t g_bchunk = 0;
int g_binflight = 8;
int g_bench_nsizes;
size_t g_bench_sizes[MAXSIZES];

/* ================================================================= parent / runner */

typedef struct {
  const char* name;
  int (*fn)(rctx_t*);
  int timeout_s;            /* for 2 ranks; scaled by nranks/2 */
  int short_timeout_env;    /* FABRICOLL_TIMEOUT_MS = g_kill_timeout_ms in the ranks */
  int (*hook)(hc_runstate_t*);
  int fixed_ranks;          /* 0: the rank-count list */
  int min_version;
  const char* help;
} scenario_t;

/* In a forked rank (hc_run_ranks): the scenario with this harness's context around *h. */
static int rank_main(const void* arg, hc_rank_t* h, void* shm) {
  rctx_t c = {.hc = *h, .shm = shm};
  int rc = ((const scenario_t*)arg)->fn(&c);
  *h = c.hc;
  return rc;
}

/* Runs the scenario with nranks ranks once; 0 = all good. reason/details are appended to. With
 * shm_out the shared struct is handed back (munmap it), else unmapped. */
static int run_ranks(const scenario_t* spec, int nranks, struct shm** shm_out, char* reason, size_t rlen,
                     char* details, size_t dlen) {
  hc_runspec_t hs = {spec->name, nranks, (int)(spec->timeout_s * g_time_scale * (nranks > 2 ? nranks / 2.0 : 1.0)),
                     g_op_timeout_ms, spec->short_timeout_env ? g_kill_timeout_ms : 0, sizeof(struct shm), rank_main,
                     spec, spec->hook, g_kill_victim};
  void* shm = NULL;
  int r = hc_run_ranks(&hs, reason, rlen, details, dlen, NULL, shm_out ? &shm : NULL);
  if (shm_out) *shm_out = shm;
  return r;
}

/* kill: the parent SIGKILLs the victim once every rank has completed 2 collectives */
static int kill_hook(hc_runstate_t* rs) {
  struct shm* shm = rs->shm;
  int64_t kill_ns = atomic_load(&shm->b.kill_ns);
  if (kill_ns) {
    double since = (double)(now_ns() - kill_ns) / 1e9;
    for (int s = 0; s < rs->spec->nranks; s++)
      if (s != g_kill_victim && !rs->exited[s] && since > (g_kill_timeout_ms + 5000) / 1000.0 + 5) {
        snprintf(rs->reason, sizeof rs->reason,
                 "rank %d (survivor) is stuck inside a plugin call %.0f s after rank %d was SIGKILLed (stage: %s); "
                 "stacks on stderr",
                 s, since, g_kill_victim, shm->b.stage[s]);
        dump_stacks("kill", s, rs->pid[s]);
        return -1;
      }
    return 0;
  }
  int all = 1;
  for (int r = 0; r < rs->spec->nranks; r++)
    if (atomic_load(&shm->b.progress[r]) < 2) all = 0;
  if (all) {
    int v = g_kill_victim;
    atomic_store(&shm->b.kill_ns, now_ns());
    rs->expect_killed[v] = 1;
    kill(rs->pid[v], SIGKILL);
    vlog("[kill] parent SIGKILLed rank %d (pid %d)\n", v, (int)rs->pid[v]);
    return 0;
  }
  if (now_ns() - rs->start > 60000000000LL) {
    snprintf(rs->reason, sizeof rs->reason, "the 8 MiB allreduce loop never got going (60 s; rank 0 stage: %s)",
             shm->b.stage[0]);
    return -1;
  }
  return 0;
}

static scenario_t g_scen[] = {
    {"symbols", scn_symbols, 90, 0, NULL, 0, 6,
     "v6..v12 resolve as data symbols of the right size, members, init/devices/getProperties each, connect"},
    {"support", scn_support, 90, 0, NULL, 0, 6,
     "reduceSupport 12 types x 4 ops (printed), beyond-range probes, regMr/deregMr, regMrDmaBuf fails"},
    {"allreduce", scn_allreduce, 240, 0, NULL, 0, 6,
     "every type x op on counts 1/1000/65537, 1Mi for 6 cases, random mantissas, in place; exact, bit-identical"},
    {"allgather", scn_allgather, 180, 0, NULL, 0, 8,
     "iallgather, one part, bytesPerRank 1/4099/1MiB: whole buffer, then unaligned windows covering it"},
    {"reducescatter", scn_reducescatter, 180, 0, NULL, 0, 8,
     "ireducescatter, one part, 9 type/op/bpr cases: whole buffer, then unaligned windows covering it"},
    {"inflight", scn_inflight, 120, 0, NULL, 0, 6,
     "4 iallreduce in flight on one collComm, each completed alone in a rank-dependent order"},
    {"twocomms", scn_twocomms, 120, 0, NULL, 0, 6,
     "two communicators in one process (v11+: two init ctxs), ops in flight on both, close one, use the other"},
    {"kill", scn_kill, 120, 1, kill_hook, 4, 6,
     "4 ranks; SIGKILL rank 2, then rank 0, during 8 MiB allreduces: survivors' test() must fail in time"},
    {"versions", scn_versions, 180, 0, NULL, 0, 6,
     "connect + allreduce (+ allgather/reducescatter for v8+) through each of v6..v12's own table"},
};
#define NSCEN ((int)(sizeof g_scen / sizeof g_scen[0]))

static void usage(FILE* f) {
  fprintf(f,
          "usage: collnet_harness --lib PATH [--scenario NAME[,NAME...]|all] [--skip NAME[,...]] [--ranks N[,N...]]\n"
          "                       [--version 6..12] [--op-timeout-ms MS] [--kill-timeout-ms MS] [--time-scale F]\n"
          "       collnet_harness --lib PATH --bench [--ranks R] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP]\n"
          "                       [-c 0|1] [--version V] [--chunk BYTES [--inflight K]]   (sizes accept K/M/G)\n"
          "--chunk cuts each size into BYTES-sized calls with up to K (8) in flight, as NCCL's proxy does.\n"
          "Without --ranks every scenario runs for 2, 3, 4 and 5 ranks (kill: 4 ranks); --ranks 2,5 runs 2 and 5\n"
          "(kill: 4); --ranks N runs everything with N ranks (kill needs N >= 3).\n"
          "scenarios:\n");
  for (int i = 0; i < NSCEN; i++) fprintf(f, "  %-14s %s\n", g_scen[i].name, g_scen[i].help);
}

static size_t parse_size(const char* s) {
  char* end;
  double v = strtod(s, &end);
  switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
  }
  return (size_t)v;
}

static int run_bench(int nranks) {
  g_bench_nsizes = 0;
  for (size_t s = g_bmin; s <= g_bmax && g_bench_nsizes < MAXSIZES; s *= g_bfactor) {
    g_bench_sizes[g_bench_nsizes++] = s & ~(size_t)3;
    if (g_bfactor < 2) break;
  }
  scenario_t spec = {"bench", scn_bench, 1800, 0, NULL, 0, 6, ""};
  char reason[4 * FAIL_LEN] = "", details[2 * DETAIL_LEN] = "";
  struct shm* shm = NULL;
  printf("# collnet_harness bench: iallreduce + test() via %s, %d ranks, float sum, %d warm-up + %d timed "
         "iterations, FABRICOLL_PROVIDER=%s\n",
         cn_symbol_name(g_version), nranks, g_bwarm, g_biters,
         getenv("FABRICOLL_PROVIDER") ? getenv("FABRICOLL_PROVIDER") : "(unset)");
  if (g_bchunk) printf("# chunked as NCCL's proxy: %zu-byte calls, up to %d in flight\n", g_bchunk, g_binflight);
  printf("# time: the slowest rank's mean per size; busbw = 2(n-1)/n x bytes / time\n");
  printf("%12s %12s %12s %8s\n", "size", "time_us", "busbw_GBps", "#wrong");
  fflush(stdout);
  int r = run_ranks(&spec, nranks, &shm, reason, sizeof reason, details, sizeof details);
  if (shm) {
    for (int k = 0; k < g_bench_nsizes; k++) {
      double worst = 0;
      int bad = 0, have = 1;
      for (int q = 0; q < nranks; q++) {
        if (shm->bench_us[q][k] <= 0) have = 0;
        if (shm->bench_us[q][k] > worst) worst = shm->bench_us[q][k];
        bad += shm->bench_bad[q][k];
      }
      if (!have) break;
      double bw = 2.0 * (nranks - 1) / nranks * (double)g_bench_sizes[k] / (worst * 1e3);
      if (g_bcheck) printf("%12zu %12.2f %12.3f %8d\n", g_bench_sizes[k], worst, bw, bad);
      else printf("%12zu %12.2f %12.3f %8s\n", g_bench_sizes[k], worst, bw, "N/A");
      if (bad) r = -1;
    }
    munmap(shm, sizeof *shm);
  }
  if (r != 0) {
    for (char* p = reason; *p; p++)
      if (*p == '\n') *p = ' ';
    printf("# FAIL bench: %s\n", reason[0] ? reason : "wrong results");
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  const char* which = "all";
  const char* skip = NULL;
  int ranks = 0, bench = 0;
  int rlist[MAXR], nrlist = 0; /* --ranks N[,N...] */
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* val = i + 1 < argc ? argv[i + 1] : NULL;
    int takes = !strcmp(a, "--lib") || !strcmp(a, "--scenario") || !strcmp(a, "--skip") || !strcmp(a, "--version") ||
                !strcmp(a, "--op-timeout-ms") || !strcmp(a, "--kill-timeout-ms") || !strcmp(a, "--ranks") ||
                !strcmp(a, "--time-scale") || !strcmp(a, "-b") || !strcmp(a, "-e") || !strcmp(a, "-f") ||
                !strcmp(a, "-n") || !strcmp(a, "-w") || !strcmp(a, "-c") || !strcmp(a, "--chunk") ||
                !strcmp(a, "--inflight");
    if (takes) {
      if (!val) {
        fprintf(stderr, "collnet_harness: %s needs a value\n", a);
        return 2;
      }
      i++;
    }
    if (!strcmp(a, "--lib")) g_lib = val;
    else if (!strcmp(a, "--scenario")) which = val;
    else if (!strcmp(a, "--skip")) skip = val;
    else if (!strcmp(a, "--version")) g_version = atoi(val);
    else if (!strcmp(a, "--op-timeout-ms")) g_op_timeout_ms = atoi(val);
    else if (!strcmp(a, "--kill-timeout-ms")) g_kill_timeout_ms = atoi(val);
    else if (!strcmp(a, "--ranks")) {
      nrlist = 0; /* the last --ranks wins */
      for (const char* p = val; *p && nrlist < MAXR;) {
        rlist[nrlist++] = atoi(p);
        const char* q = strchr(p, ',');
        if (!q) break;
        p = q + 1;
      }
      ranks = nrlist ? rlist[0] : 0;
    }
    else if (!strcmp(a, "--time-scale")) g_time_scale = atof(val);
    else if (!strcmp(a, "-b")) g_bmin = parse_size(val);
    else if (!strcmp(a, "-e")) g_bmax = parse_size(val);
    else if (!strcmp(a, "-f")) g_bfactor = (size_t)atoi(val);
    else if (!strcmp(a, "-n")) g_biters = atoi(val);
    else if (!strcmp(a, "-w")) g_bwarm = atoi(val);
    else if (!strcmp(a, "-c")) g_bcheck = atoi(val);
    else if (!strcmp(a, "--chunk")) g_bchunk = parse_size(val);
    else if (!strcmp(a, "--inflight")) g_binflight = atoi(val);
    else if (!strcmp(a, "--bench")) bench = 1;
    else if (!strcmp(a, "--list") || !strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "collnet_harness: unknown argument %s\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (!g_lib) {
    fprintf(stderr, "collnet_harness: --lib PATH is required\n");
    usage(stderr);
    return 2;
  }
  if (g_version < NET_MIN_VERSION || g_version > NET_MAX_VERSION) {
    fprintf(stderr, "collnet_harness: --version must be 6..12\n");
    return 2;
  }
  for (int k = 0; k < nrlist; k++)
    if (rlist[k] < 1 || rlist[k] > MAXR) {
      fprintf(stderr, "collnet_harness: --ranks values must be 1..%d\n", MAXR);
      return 2;
    }
  if (bench && nrlist > 1) {
    fprintf(stderr, "collnet_harness: --bench takes one rank count\n");
    return 2;
  }
  if (g_op_timeout_ms < 100 || g_kill_timeout_ms < 1 || !(g_time_scale > 0)) {
    fprintf(stderr, "collnet_harness: bad numeric option\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (bench) {
    if (g_bmin < 4 || g_bmax < g_bmin || g_bfactor < 1 || g_biters < 1 || g_bwarm < 0 ||
        (g_bchunk && g_bchunk < 4) || g_binflight < 1 || g_binflight > MAXINFLIGHT) {
      fprintf(stderr, "collnet_harness: bad bench sizes/iterations (--chunk >= 4, --inflight 1..%d)\n", MAXINFLIGHT);
      return 2;
    }
    return run_bench(ranks ? ranks : 2);
  }
  int all = !strcmp(which, "all");
  _Static_assert(offsetof(scenario_t, name) == 0, "unknown_scenario() reads each entry's name first");
  if (!all && unknown_scenario("collnet_harness", which, g_scen, sizeof g_scen[0], NSCEN)) {
    usage(stderr);
    return 2;
  }
  warn_missing_lib("collnet_harness", g_lib);
  fprintf(stderr, "collnet_harness: lib %s, table v%d, FABRICOLL_PROVIDER=%s FABRICOLL_DOMAIN=%s\n", g_lib, g_version,
          getenv("FABRICOLL_PROVIDER") ? getenv("FABRICOLL_PROVIDER") : "(unset)",
          getenv("FABRICOLL_DOMAIN") ? getenv("FABRICOLL_DOMAIN") : "(unset)");
  static const int default_ranks[] = {2, 3, 4, 5};
  int passed = 0, failed = 0;
  for (int i = 0; i < NSCEN; i++) {
    const scenario_t* s = &g_scen[i];
    if (!all && !in_list(which, s->name)) continue;
    if (in_list(skip, s->name)) continue;
    int list[MAXR], nl = 0;
    if (nrlist == 1) list[nl++] = ranks; /* one count: every scenario, kill included, runs with it */
    else if (s->fixed_ranks) list[nl++] = s->fixed_ranks;
    else if (nrlist > 1)
      for (int k = 0; k < nrlist; k++) list[nl++] = rlist[k];
    else
      for (int k = 0; k < 4; k++) list[nl++] = default_ranks[k];
    for (int k = 0; k < nl; k++) {
      int n = list[k];
      if (g_version < s->min_version) {
        printf("SKIP %s np%d (needs table v%d+, running v%d)\n", s->name, n, s->min_version, g_version);
        continue;
      }
      if (!strcmp(s->name, "kill") && n < 3) {
        printf("SKIP %s np%d (needs 3+ ranks)\n", s->name, n);
        continue;
      }
      char reason[4 * FAIL_LEN] = "", details[2 * DETAIL_LEN] = "";
      fprintf(stderr, "collnet_harness: running %s np%d\n", s->name, n);
      int64_t t0 = now_ns();
      int r;
      if (!strcmp(s->name, "kill")) {
        int victims[2] = {n / 2, 0}; /* a middle rank, then rank 0 */
        r = 0;
        for (int vi = 0; vi < 2; vi++) {
          g_kill_victim = victims[vi];
          char r1[2 * FAIL_LEN] = "", d1[DETAIL_LEN] = "";
          struct shm* ks = NULL;
          if (run_ranks(s, n, &ks, r1, sizeof r1, d1, sizeof d1) != 0) {
            r = -1;
            append(reason, sizeof reason, "%svictim rank %d: %s", reason[0] ? " || " : "", victims[vi], r1);
          } else if (ks) {
            append(details, sizeof details, "%svictim %d: survivors' errors", details[0] ? "; " : "", victims[vi]);
            double worst = 0;
            for (int q = 0; q < n; q++)
              if (q != victims[vi]) {
                double ms = (double)atomic_load(&ks->kms_x10[q]) / 10;
                if (ms > worst) worst = ms;
                append(details, sizeof details, " %d", atomic_load(&ks->kerr[q]));
              }
            append(details, sizeof details, " after <= %.0f ms (%lld collectives before)", worst,
                   (long long)atomic_load(&ks->kdone[(victims[vi] + 1) % n]));
          }
          if (ks) munmap(ks, sizeof *ks);
        }
      } else {
        r = run_ranks(s, n, NULL, reason, sizeof reason, details, sizeof details);
      }
      if (!strcmp(s->name, "support")) g_print_matrix = 0;
      double secs = ms_since(t0) / 1000;
      if (r == 0) {
        passed++;
        printf("PASS %s np%d (%s%s%.1f s)\n", s->name, n, details, details[0] ? "; " : "", secs);
      } else {
        failed++;
        for (char* p = reason; *p; p++)
          if (*p == '\n') *p = ' ';
        printf("FAIL %s np%d: %s (%.1f s)\n", s->name, n, reason, secs);
      }
      fflush(stdout);
    }
  }
  printf("collnet_harness: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
