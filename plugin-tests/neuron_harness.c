/*
 * neuron_harness: multi-process conformance tests for a Neuron net plugin (libnccom-net.so:
 * ncclNetPlugin_v4, _v5, _v6 in Neuron's layouts, neuron_net.h), playing libnccom.
 *
 *   neuron_harness [--lib PATH] [--scenario NAME[,NAME...]|all] [--skip NAME[,...]]
 *                  [--op-timeout-ms 30000] [--kill-timeout-ms 3000] [--cycles 300] [--expect-rma 0|1]
 *                  [--list]
 *
 * The library is --lib, else $FABRICOLL_NEURON_LIB, else <repo>/target/release/libnccom-net.so
 * (<repo> found from this program's path, plugin-tests/build/). Process model (as net_harness):
 * the parent never loads the library; for each scenario it maps an anonymous MAP_SHARED mailbox
 * and forks the ranks, each of which dlopens the library (RTLD_NOW|RTLD_LOCAL) itself. Ranks
 * exchange handles, addresses and keys through the mailbox, polling with deadlines. The parent
 * waits with the scenario's deadline, kills what is left and prints
 *   PASS name (details; N checks)      or      FAIL name: reason
 * then "neuron_harness: N passed, M failed", exiting non-zero on any failure.
 * HARNESS_VERBOSE=1 prints progress and the library's log lines.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "neuron_harness.h"

const char* g_lib;
int g_op_timeout_ms = 30000;
int g_kill_timeout_ms = 3000;
int g_cycles = 300;
int g_expect_rma = -1;

typedef struct {
  const char* name;
  const char* help;
  int nranks;
  int (*fn)(rctx_t*);
  int timeout_s;
  int short_timeout_env;          /* FABRICOLL_TIMEOUT_MS = g_kill_timeout_ms in the ranks */
  int (*hook)(hc_runstate_t*);    /* called by the parent while waiting; -1 = fail (rs->reason) */
  int kill_both;                  /* run twice: the receiver killed, then the sender */
} scenario_t;

/* In a forked rank (hc_run_ranks): the scenario with this harness's context around *h. */
static int rank_main(const void* arg, hc_rank_t* h, void* shm) {
  rctx_t c = {.hc = *h, .shm = shm};
  int rc = ((const scenario_t*)arg)->fn(&c);
  *h = c.hc;
  return rc;
}

/* Runs the scenario's ranks (kill: twice); 0 = all good. reason/details/checks are appended to. */
static int run_ranks(const scenario_t* s, char* reason, size_t rlen, char* details, size_t dlen, long long* checks) {
  hc_runspec_t spec = {s->name, s->nranks, s->timeout_s, g_op_timeout_ms, s->short_timeout_env ? g_kill_timeout_ms : 0,
                       sizeof(struct shm), rank_main, s, s->hook, 1};
  if (s->kill_both) return hc_run_kill_pair(&spec, reason, rlen, details, dlen, checks);
  return hc_run_ranks(&spec, reason, rlen, details, dlen, checks, NULL);
}

static scenario_t g_scenarios[] = {
    {"symbols", "dlsym v4/v5/v6: every slot set, name; NVIDIA-only symbols absent", 1, scn_symbols, 60, 0, NULL, 0},
    {"props", "devices/getProperties of v6 (rank 0), v5 (rank 1), v4 (rank 2): values and sizes", 3, scn_props, 60, 0,
     NULL, 0},
    {"lifecycle", "v6: calls before init, init twice, fini with open objects, fini twice, quiet close after fini, "
                  "re-init and transfer",
     2, scn_lifecycle, 120, 0, NULL, 0},
    {"connect1", "one thread: listen, connect/accept alternately on the same handle (v6 rank 0, v5 rank 1)", 2,
     scn_connect1, 60, 0, NULL, 0},
    {"mesh4", "4 ranks, v6: every rank connects to and accepts from all others in one thread, 256 KiB each", 4,
     scn_mesh4, 120, 0, NULL, 0},
    {"connect4", "v4: blocking connect and accept in two processes, 64-byte handles", 2, scn_connect4, 60, 0, NULL, 0},
    {"xfer6", "v6: 0 B..64 MiB both ways, checked byte by byte, iflush", 2, scn_xfer6, 300, 0, NULL, 0},
    {"xfer5", "v5: 0 B..64 MiB both ways, checked byte by byte, iflush", 2, scn_xfer5, 300, 0, NULL, 0},
    {"xfer4", "v4: 0 B..64 MiB both ways, checked byte by byte", 2, scn_xfer4, 300, 0, NULL, 0},
    {"inflight", "v6: 128 irecvs then 128 isends outstanding on one comm, then test all", 2, scn_inflight, 120, 0,
     NULL, 0},
    {"bigreg", "v6: 2.5 GiB MAP_NORESERVE regMr (send from above 2 GiB), sub-page and 0-byte registrations", 1,
     scn_bigreg, 120, 0, NULL, 0},
    {"rma6", "v6: getMrKey, iwrite, iwriteInline, iread at offsets (or the four errors without RMA)", 2, scn_rma6,
     120, 0, NULL, 0},
    {"rma5", "v5: the same through the v5 table", 2, scn_rma5, 120, 0, NULL, 0},
    {"ring6", "4 ranks, v6, both rings: iwrite to next and iread from previous, then a small message backward "
              "and one forward, 40 rounds",
     4, scn_ring6, 300, 0, NULL, 0},
    {"ring5", "the same through the v5 table", 4, scn_ring5, 300, 0, NULL, 0},
    {"badinput", "NULL comms, garbage handle, CUDA/NEURON/other registration types, irecv n = 0/9", 1, scn_badinput,
     120, 1, NULL, 0},
    {"v4block", "v4 accept with nobody connecting and connect to a zeroed handle end at FABRICOLL_TIMEOUT_MS", 1,
     scn_v4block, 60, 1, NULL, 0},
    {"cycles", "N listen/connect/accept/1 KiB/close cycles: open fds and RSS before/after", 2, scn_cycles, 600, 0,
     NULL, 0},
    {"ringcycles", "4 ranks, N cycles of both rings up, 256 KiB each way on fresh registrations, closed: fds, RSS",
     4, scn_ringcycles, 900, 0, NULL, 0},
    {"kill", "SIGKILL one rank mid-stream (receiver, then sender): the survivor gets an error in time", 2, scn_kill,
     120, 1, hc_kill_pair_hook, 1},
};
#define NSCEN ((int)(sizeof g_scenarios / sizeof g_scenarios[0]))

static void usage(FILE* f) {
  fprintf(f, "usage: neuron_harness [--lib PATH] [--scenario NAME[,NAME...]|all] [--skip NAME[,...]]\n"
             "                      [--op-timeout-ms MS] [--kill-timeout-ms MS] [--cycles N] [--expect-rma 0|1]\n"
             "                      [--list]\n"
             "--expect-rma: the rma_supported that v5/v6 getProperties must report (neuron_run.sh: from fi_info)\n"
             "library: --lib, else $FABRICOLL_NEURON_LIB, else <repo>/target/release/libnccom-net.so\nscenarios:\n");
  for (int i = 0; i < NSCEN; i++) fprintf(f, "  %-10s %d rank(s): %s\n", g_scenarios[i].name, g_scenarios[i].nranks,
                                          g_scenarios[i].help);
}

/* <repo>/target/release/libnccom-net.so, <repo> being three levels above this program. */
static const char* default_lib(void) {
  static char path[PATH_MAX + 64];
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return "target/release/libnccom-net.so";
  exe[n] = 0;
  for (int up = 0; up < 3; up++) {
    char* slash = strrchr(exe, '/');
    if (!slash) return "target/release/libnccom-net.so";
    *slash = 0;
  }
  snprintf(path, sizeof path, "%s/target/release/libnccom-net.so", exe);
  return path;
}

static int parse_int(const char* opt, const char* val, int min, int* out) {
  char* end = NULL;
  errno = 0;
  long v = strtol(val, &end, 10);
  if (errno || !end || *end || v < min || v > INT_MAX) {
    fprintf(stderr, "neuron_harness: %s: '%s' is not an integer >= %d\n", opt, val, min);
    return -1;
  }
  *out = (int)v;
  return 0;
}

int main(int argc, char** argv) {
  const char* which = "all";
  const char* skip = NULL;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (!strcmp(a, "--list") || !strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "neuron_harness: unknown argument or missing value: %s\n", a);
      usage(stderr);
      return 2;
    }
    const char* val = argv[++i];
    int bad = 0;
    if (!strcmp(a, "--lib")) g_lib = val;
    else if (!strcmp(a, "--scenario")) which = val;
    else if (!strcmp(a, "--skip")) skip = val;
    else if (!strcmp(a, "--op-timeout-ms")) bad = parse_int(a, val, 100, &g_op_timeout_ms);
    else if (!strcmp(a, "--kill-timeout-ms")) bad = parse_int(a, val, 1, &g_kill_timeout_ms);
    else if (!strcmp(a, "--cycles")) bad = parse_int(a, val, 10, &g_cycles);
    else if (!strcmp(a, "--expect-rma")) {
      bad = strcmp(val, "0") != 0 && strcmp(val, "1") != 0;
      if (bad) fprintf(stderr, "neuron_harness: --expect-rma: '%s' is neither 0 nor 1\n", val);
      else g_expect_rma = val[0] - '0';
    }
    else {
      fprintf(stderr, "neuron_harness: unknown argument %s\n", a);
      usage(stderr);
      return 2;
    }
    if (bad) return 2;
  }
  if (!g_lib) g_lib = getenv("FABRICOLL_NEURON_LIB");
  if (!g_lib || !*g_lib) g_lib = default_lib();
  int all = !strcmp(which, "all");
  _Static_assert(offsetof(scenario_t, name) == 0, "unknown_scenario() reads each entry's name first");
  if (!all && unknown_scenario("neuron_harness", which, g_scenarios, sizeof g_scenarios[0], NSCEN)) {
    usage(stderr);
    return 2;
  }
  warn_missing_lib("neuron_harness", g_lib);
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  fprintf(stderr, "neuron_harness: lib %s, FABRICOLL_PROVIDER=%s FABRICOLL_DOMAIN=%s\n", g_lib,
          getenv("FABRICOLL_PROVIDER") ? getenv("FABRICOLL_PROVIDER") : "(unset)",
          getenv("FABRICOLL_DOMAIN") ? getenv("FABRICOLL_DOMAIN") : "(unset)");
  int passed = 0, failed = 0;
  long long total_checks = 0;
  for (int i = 0; i < NSCEN; i++) {
    const scenario_t* s = &g_scenarios[i];
    if ((!all && !in_list(which, s->name)) || in_list(skip, s->name)) continue;
    char reason[4 * FAIL_LEN] = "", details[2 * DETAIL_LEN] = "";
    long long checks = 0;
    fprintf(stderr, "neuron_harness: running %s\n", s->name);
    int64_t t0 = now_ns();
    int r = run_ranks(s, reason, sizeof reason, details, sizeof details, &checks);
    total_checks += checks;
    double secs = ms_since(t0) / 1000;
    if (r == 0) {
      passed++;
      printf("PASS %s (%s%s%lld checks, %.1f s)\n", s->name, details, details[0] ? "; " : "", checks, secs);
    } else {
      failed++;
      for (char* p = reason; *p; p++)
        if (*p == '\n') *p = ' ';
      printf("FAIL %s: %s\n", s->name, reason);
    }
  }
  printf("neuron_harness: %lld checks\n", total_checks);
  printf("neuron_harness: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
