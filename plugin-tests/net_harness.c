/*
 * net_harness: multi-process conformance tests for an NCCL net plugin (ncclNetPlugin_v6..v12),
 * written for fabricoll.
 *
 *   net_harness --lib PATH [--scenario NAME[,NAME...]|all] [--skip NAME[,...]] [--version 12]
 *               [--op-timeout-ms 30000] [--kill-timeout-ms 3000] [--cycles 1000] [--time-scale 1.0]
 *               [--expect-multi N] [--list]
 *
 * Process model: the parent never dlopens the plugin. For every scenario it makes an anonymous
 * MAP_SHARED mapping, then forks the scenario's rank processes; each rank dlopens the plugin
 * itself (there is no fork after dlopen anywhere). Ranks exchange 128-byte handles and flags
 * through the mapping by polling with deadlines; nothing blocks on a dead process. The parent
 * waits with a global deadline, kills what is left, and prints
 *   PASS name (details)        or        FAIL name: reason
 * then "net_harness: N passed, M failed", exiting non-zero on any failure.
 *
 * Environment: FABRICOLL_* variables are passed through to the plugin unchanged, except that the
 * kill and badinput ranks get FABRICOLL_TIMEOUT_MS=<--kill-timeout-ms> (default 3000) so that a
 * dead peer or an unusable handle is reported within a bounded time. HARNESS_VERBOSE=1 prints
 * progress and the plugin's log messages.
 *
 * This file holds the command line, the scenario table and the parent's loop; net_harness.h
 * what the parts share, net_util.c the ranks' helpers and net_scn_*.c the scenarios.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net_harness.h"

/* ------------------------------------------------------------------------------ configuration */

const char* g_lib;
int g_version = 12;
int g_op_timeout_ms = 30000;
int g_kill_timeout_ms = 3000;
int g_cycles = 1000;
double g_time_scale = 1.0;
int g_expect_multi = 0; /* --expect-multi: the maxMultiRequestSize v11+ must report (0: any) */

/* ============================================================================ parent / runner */

typedef struct {
  const char* name;
  int nranks;
  int (*fn)(rctx_t*);
  int timeout_s;
  int short_timeout_env; /* FABRICOLL_TIMEOUT_MS = g_kill_timeout_ms in the ranks */
  int (*hook)(hc_runstate_t*); /* called by the parent while waiting; -1 = fail (rs->reason) */
} runspec_t;

/* In a forked rank (hc_run_ranks): the scenario with this harness's context around *h. */
static int rank_main(const void* arg, hc_rank_t* h, void* shm) {
  rctx_t c = {.hc = *h, .shm = shm};
  int rc = ((const runspec_t*)arg)->fn(&c);
  *h = c.hc;
  return rc;
}

/* What the shared runner needs to run this scenario. */
static hc_runspec_t hc_spec(const runspec_t* spec) {
  return (hc_runspec_t){spec->name, spec->nranks, (int)(spec->timeout_s * g_time_scale), g_op_timeout_ms,
                        spec->short_timeout_env ? g_kill_timeout_ms : 0, sizeof(struct shm), rank_main, spec,
                        spec->hook, 1};
}

/* Runs one set of ranks; 0 = all good. reason/details are appended to. */
static int run_ranks(const runspec_t* spec, char* reason, size_t rlen, char* details, size_t dlen) {
  hc_runspec_t hs = hc_spec(spec);
  return hc_run_ranks(&hs, reason, rlen, details, dlen, NULL, NULL);
}

typedef struct scenario scenario_t;
struct scenario {
  const char* name;
  const char* help;
  int (*parent)(const scenario_t*, char*, size_t, char*, size_t); /* NULL: run_ranks(&spec) */
  runspec_t spec;
};

static int parent_kill(const scenario_t* s, char* reason, size_t rlen, char* details, size_t dlen) {
  hc_runspec_t hs = hc_spec(&s->spec);
  return hc_run_kill_pair(&hs, reason, rlen, details, dlen, NULL);
}

static int parent_cycles(const scenario_t* s, char* reason, size_t rlen, char* details, size_t dlen) {
  int64_t t0 = now_ns();
  int r = run_ranks(&s->spec, reason, rlen, details, dlen);
  char tmp[DETAIL_LEN];
  snprintf(tmp, sizeof tmp, "%d cycles in %.1f s; %s", g_cycles, ms_since(t0) / 1000, details);
  copy_str(details, dlen, tmp);
  return r;
}

static scenario_t g_scenarios[] = {
    {"symbols", "dlsym v6..v12, init/devices/getProperties (canary), finalize", NULL,
     {"symbols", 1, scn_symbols, 60, 0, NULL}},
    {"connect2", "2 processes: listen / connect / accept polling, closeListen, close", NULL,
     {"connect2", 2, scn_connect2, 60, 0, NULL}},
    {"connect1", "1 thread: connect/accept alternately, NULL devComm, 1 MiB on 2 loopback pairs", NULL,
     {"connect1", 1, scn_connect1, 60, 0, NULL}},
    {"xfer", "sizes 0..64 MiB both ways, recv buffer larger, with and without iflush", NULL,
     {"xfer", 2, scn_xfer, 240, 0, NULL}},
    {"group", "grouped receives n=1..maxRecvs, shuffled tags, posted-order matching", NULL,
     {"group", 2, scn_group, 120, 0, NULL}},
    {"inflight32", "32 isends / 32 irecvs outstanding at once", NULL,
     {"inflight32", 2, scn_inflight32, 120, 0, NULL}},
    {"pairs16", "16 comm pairs between two processes, interleaved traffic", NULL,
     {"pairs16", 2, scn_pairs16, 120, 0, NULL}},
    {"crossed", "2 comms on one connection: the later one's message received first", NULL,
     {"crossed", 2, scn_crossed, 120, 0, NULL}},
    {"ring4", "4 processes in a ring, 100 laps, each hop transforms the buffer", NULL,
     {"ring4", 4, scn_ring4, 180, 0, NULL}},
    {"badinput", "bad arguments return errors without crashing; 0x1 request hint", NULL,
     {"badinput", 1, scn_badinput, 120, 1, NULL}},
    {"kill", "SIGKILL one rank mid-transfer (receiver, then sender): survivor's test() must fail", parent_kill,
     {"kill", 2, scn_kill_rank, 120, 1, hc_kill_pair_hook}},
    {"cycles", "N cycles of listen/connect/accept/regMr/1 KiB/deregMr/close; fd and RSS growth", parent_cycles,
     {"cycles", 2, scn_cycles, 900, 0, NULL}},
    {"multi", "v11+ multi-request groups (NCCL_NET_MULTI_REQUEST) of 1..maxMultiRequestSize each way; misuse", NULL,
     {"multi", 2, scn_multi, 240, 0, NULL}},
    {"versions", "connect + 64 KiB each way through each of v6..v12", NULL,
     {"versions", 2, scn_versions, 180, 0, NULL}},
    {"reload", "dlopen/init/use/finalize/dlclose 3 times (NCCL unloads the plugin with its last comm)", NULL,
     {"reload", 1, scn_reload, 120, 0, NULL}},
};
#define NSCEN ((int)(sizeof g_scenarios / sizeof g_scenarios[0]))

static void usage(FILE* f) {
  fprintf(f,
          "usage: net_harness --lib PATH [--scenario NAME[,NAME...]|all] [--skip NAME[,...]] [--version 6..12]\n"
          "                   [--op-timeout-ms MS] [--kill-timeout-ms MS] [--cycles N] [--time-scale F]\n"
          "                   [--expect-multi N (v11+ maxMultiRequestSize; also runs multi's busy part)] [--list]\n"
          "scenarios:\n");
  for (int i = 0; i < NSCEN; i++) fprintf(f, "  %-11s %s\n", g_scenarios[i].name, g_scenarios[i].help);
}

int main(int argc, char** argv) {
  const char* which = "all";
  const char* skip = NULL;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* val = i + 1 < argc ? argv[i + 1] : NULL;
    int takes = !strcmp(a, "--lib") || !strcmp(a, "--scenario") || !strcmp(a, "--skip") || !strcmp(a, "--version") ||
                !strcmp(a, "--op-timeout-ms") || !strcmp(a, "--kill-timeout-ms") || !strcmp(a, "--cycles") ||
                !strcmp(a, "--time-scale") || !strcmp(a, "--expect-multi");
    if (takes) {
      if (!val) {
        fprintf(stderr, "net_harness: %s needs a value\n", a);
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
    else if (!strcmp(a, "--cycles")) g_cycles = atoi(val);
    else if (!strcmp(a, "--time-scale")) g_time_scale = atof(val);
    else if (!strcmp(a, "--expect-multi")) g_expect_multi = atoi(val);
    else if (!strcmp(a, "--list") || !strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "net_harness: unknown argument %s\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (!g_lib) {
    fprintf(stderr, "net_harness: --lib PATH is required\n");
    usage(stderr);
    return 2;
  }
  if (g_version < NET_MIN_VERSION || g_version > NET_MAX_VERSION) {
    fprintf(stderr, "net_harness: --version must be 6..12\n");
    return 2;
  }
  if (g_cycles < 1 || g_op_timeout_ms < 100 || g_kill_timeout_ms < 1 || !(g_time_scale > 0)) {
    fprintf(stderr, "net_harness: bad numeric option\n");
    return 2;
  }
  int all = !strcmp(which, "all");
  _Static_assert(offsetof(scenario_t, name) == 0, "unknown_scenario() reads each entry's name first");
  if (!all && unknown_scenario("net_harness", which, g_scenarios, sizeof g_scenarios[0], NSCEN)) {
    usage(stderr);
    return 2;
  }
  warn_missing_lib("net_harness", g_lib);
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  fprintf(stderr, "net_harness: lib %s, table v%d, FABRICOLL_PROVIDER=%s FABRICOLL_DOMAIN=%s\n", g_lib, g_version,
          getenv("FABRICOLL_PROVIDER") ? getenv("FABRICOLL_PROVIDER") : "(unset)",
          getenv("FABRICOLL_DOMAIN") ? getenv("FABRICOLL_DOMAIN") : "(unset)");
  int passed = 0, failed = 0;
  for (int i = 0; i < NSCEN; i++) {
    const scenario_t* s = &g_scenarios[i];
    if (!all && !in_list(which, s->name)) continue;
    if (in_list(skip, s->name)) continue;
    char reason[4 * FAIL_LEN] = "", details[2 * DETAIL_LEN] = "";
    fprintf(stderr, "net_harness: running %s\n", s->name);
    int64_t t0 = now_ns();
    int r = s->parent ? s->parent(s, reason, sizeof reason, details, sizeof details)
                      : run_ranks(&s->spec, reason, sizeof reason, details, sizeof details);
    double secs = ms_since(t0) / 1000;
    if (r == 0) {
      passed++;
      printf("PASS %s (%s%s%.1f s)\n", s->name, details, details[0] ? "; " : "", secs);
    } else {
      failed++;
      for (char* p = reason; *p; p++)
        if (*p == '\n') *p = ' ';
      printf("FAIL %s: %s\n", s->name, reason);
    }
    fflush(stdout);
  }
  printf("net_harness: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
