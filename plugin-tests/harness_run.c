/*
 * harness_run.c: the shared process runner and the ranks' reporting (see harness_run.h).
 */
#include "harness_run.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------ reporting */

void hc_stagef(hc_rank_t* h, const char* fmt, ...) {
  char b[STAGE_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  copy_str(h->board->stage[h->rank], STAGE_LEN, b);
  atomic_thread_fence(memory_order_release);
  vlog("[%s np%d rank %d] %s\n", h->scn, h->nranks, h->rank, b);
}

int hc_failf(hc_rank_t* h, const char* fmt, ...) {
  char msg[FAIL_LEN - 64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  /* a failure seen after another rank already failed is most likely a consequence of it */
  int cascade = atomic_exchange(&h->board->abort, 1) != 0;
  if (h->board->fail[h->rank][0] == 0) {
    char full[FAIL_LEN];
    snprintf(full, sizeof full, "rank %d: %s%s", h->rank, cascade ? "(another rank had already failed) " : "", msg);
    copy_str(h->board->fail[h->rank], FAIL_LEN, full);
  }
  fprintf(stderr, "[%s np%d rank %d pid %d] FAIL: %s\n", h->scn, h->nranks, h->rank, (int)getpid(), msg);
  return -1;
}

void hc_detailf(hc_rank_t* h, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(h->board->detail[h->rank], DETAIL_LEN, fmt, ap);
  va_end(ap);
}

int hc_check_abort(hc_rank_t* h) {
  if (atomic_load(&h->board->abort)) {
    h->aborted = 1;
    return 1;
  }
  return 0;
}

int64_t hc_op_deadline(hc_rank_t* h) {
  int64_t d = now_ns() + (int64_t)h->op_timeout_ms * 1000000LL;
  return d < h->deadline ? d : h->deadline;
}

int hc_sync_ranks(hc_rank_t* h, const char* what) {
  int target = ++h->phase;
  atomic_store(&h->board->phase[h->rank], target);
  hc_stagef(h, "barrier '%s' (phase %d)", what, target);
  int64_t deadline = hc_op_deadline(h);
  int spins = 0;
  for (;;) {
    int all = 1;
    for (int r = 0; r < h->nranks; r++)
      if (atomic_load(&h->board->phase[r]) < target) all = 0;
    if (all) return 0;
    if (hc_check_abort(h)) return -1;
    if (now_ns() > deadline) {
      char missing[64] = "";
      for (int r = 0; r < h->nranks; r++)
        if (atomic_load(&h->board->phase[r]) < target) append(missing, sizeof missing, " %d", r);
      return hc_failf(h, "timed out in barrier '%s' (phase %d); ranks not there:%s", what, target, missing);
    }
    backoff(&spins);
  }
}

void* hc_xalloc(hc_rank_t* h, size_t size, const char* what) {
  size_t sz = (size + 4095) & ~(size_t)4095;
  if (sz == 0) sz = 4096;
  void* p = aligned_alloc(4096, sz);
  if (!p) {
    hc_failf(h, "out of memory allocating %zu bytes for %s", size, what);
    return NULL;
  }
  memset(p, 0, sz);
  return p;
}

void hc_growth_init(hc_growth_t* g, int mark, int mid, int last) {
  *g = (hc_growth_t){mark, mid, last, -1, -1, -1, -1, -1};
}

void hc_growth_sample(hc_growth_t* g, int done) {
  if (done == g->mark) {
    g->fd_mark = count_fds();
    g->rss_mark = rss_bytes();
  }
  if (done == g->mid) g->rss_mid = rss_bytes();
  if (done == g->last) {
    g->fd_end = count_fds();
    g->rss_end = rss_bytes();
  }
}

int hc_check_growth(hc_rank_t* h, const hc_growth_t* g) {
  hc_detailf(h, "rank %d: fds %d -> %d, RSS %.1f -> %.1f -> %.1f MiB (after cycle %d -> %d -> %d)", h->rank, g->fd_mark,
             g->fd_end, g->rss_mark / (double)MIB, g->rss_mid / (double)MIB, g->rss_end / (double)MIB, g->mark, g->mid,
             g->last);
  if (g->fd_end > g->fd_mark)
    return hc_failf(h, "open fds grew from %d (after cycle %d) to %d (after cycle %d)", g->fd_mark, g->mark, g->fd_end,
                    g->last);
  long g1 = g->rss_mid - g->rss_mark, g2 = g->rss_end - g->rss_mid;
  if (g1 > (long)(4 * MIB) && g2 > (long)(4 * MIB))
    return hc_failf(h, "RSS grew steadily: by %.1f MiB between cycle %d and %d and by %.1f MiB between cycle %d and %d "
                    "(limit 4 MiB in at least one half)", g1 / (double)MIB, g->mark, g->mid, g2 / (double)MIB, g->mid,
                    g->last);
  if (g1 + g2 > (long)(32 * MIB))
    return hc_failf(h, "RSS grew by %.1f MiB between cycle %d and %d (limit 32 MiB)", (g1 + g2) / (double)MIB, g->mark,
                    g->last);
  return 0;
}

/* ------------------------------------------------------------------------------ the runner */

static void child_main(const hc_runspec_t* spec, int rank, void* shm, pid_t parent, int64_t deadline) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(3);
  if (spec->short_timeout_ms > 0) {
    char b[32];
    snprintf(b, sizeof b, "%d", spec->short_timeout_ms);
    setenv("FABRICOLL_TIMEOUT_MS", b, 1);
  }
  hc_rank_t h;
  memset(&h, 0, sizeof h);
  h.scn = spec->name;
  h.rank = rank;
  h.nranks = spec->nranks;
  h.board = shm;
  h.deadline = deadline;
  h.op_timeout_ms = spec->op_timeout_ms;
  int rc = spec->rank_main(spec->arg, &h, shm);
  atomic_store(&h.board->checks[rank], h.checks);
  hc_stagef(&h, "exit() after %s", rc == 0 ? "success" : "failure");
  fflush(NULL);
  /* A rank that succeeded closed everything: a normal exit then shows that what the plugin left
   * for exit time does not crash. A failed rank may be mid-way through anything: _exit. */
  if (rc == 0) exit(0);
  _exit(h.aborted ? 2 : 1);
}

/* Why the rank r is still running when the parent stops waiting. */
static const char* still_running(int timed_out, int hook_failed) {
  return timed_out ? "at the scenario deadline" : hook_failed ? "when the parent gave up" : "10 s after another rank failed";
}

int hc_run_ranks(const hc_runspec_t* spec, char* reason, size_t rlen, char* details, size_t dlen, long long* checks,
                 void** shm_out) {
  if (spec->nranks < 1 || spec->nranks > HC_MAXR) {
    append(reason, rlen, "%d ranks: the runner forks 1 to %d", spec->nranks, HC_MAXR);
    return -1;
  }
  void* shm = mmap(NULL, spec->shm_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shm == MAP_FAILED) {
    append(reason, rlen, "mmap failed: %s", strerror(errno));
    return -1;
  }
  memset(shm, 0, spec->shm_size);
  hc_board_t* b = shm;
  b->kill_victim = spec->kill_victim;
  hc_runstate_t rs;
  memset(&rs, 0, sizeof rs);
  rs.spec = spec;
  rs.shm = shm;
  rs.start = now_ns();
  int64_t deadline = rs.start + (int64_t)spec->timeout_s * 1000000000LL;
  int64_t child_deadline = deadline - 3000000000LL;
  pid_t parent = getpid();
  fflush(NULL);
  int nforked = 0;
  for (int r = 0; r < spec->nranks; r++) {
    pid_t p = fork();
    if (p < 0) {
      append(reason, rlen, "fork failed: %s", strerror(errno));
      atomic_store(&b->abort, 1);
      break;
    }
    if (p == 0) child_main(spec, r, shm, parent, child_deadline);
    rs.pid[r] = p;
    nforked++;
  }
  int timed_out = 0, hook_failed = 0;
  int64_t first_fail = 0;
  for (;;) {
    int alive = 0;
    for (int r = 0; r < nforked; r++) {
      if (rs.exited[r]) continue;
      int st;
      if (waitpid(rs.pid[r], &st, WNOHANG) == rs.pid[r]) {
        rs.exited[r] = 1;
        rs.status[r] = st;
        int bad = !(WIFEXITED(st) && WEXITSTATUS(st) == 0) &&
                  !(rs.expect_killed[r] && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
        if (bad && !first_fail) {
          first_fail = now_ns();
          atomic_store(&b->abort, 1);
        }
      } else {
        alive++;
      }
    }
    if (!alive) break;
    if (spec->hook && !hook_failed && spec->hook(&rs) != 0) {
      hook_failed = 1;
      append(reason, rlen, "%s", rs.reason);
      atomic_store(&b->abort, 1);
      first_fail = now_ns();
    }
    int64_t now = now_ns();
    /* 10 s after a failure the others had time to notice the abort flag */
    if (now > deadline || hook_failed || (first_fail && now > first_fail + 10000000000LL)) {
      timed_out = now > deadline;
      for (int r = 0; r < nforked; r++)
        if (!rs.exited[r]) {
          append(reason, rlen, "%srank %d still running %s (stage: %s)", reason[0] ? " | " : "", r,
                 still_running(timed_out, hook_failed), b->stage[r][0] ? b->stage[r] : "?");
          if (!hook_failed) dump_stacks(spec->name, r, rs.pid[r]); /* a failing hook dumps the stuck one */
          kill(rs.pid[r], SIGKILL);
        }
      for (int r = 0; r < nforked; r++)
        if (!rs.exited[r]) {
          waitpid(rs.pid[r], &rs.status[r], 0);
          rs.exited[r] = 1;
          rs.status[r] = -1; /* killed by us */
        }
      break;
    }
    struct timespec ts = {0, 2 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  int ok = !timed_out && !hook_failed && nforked == spec->nranks;
  int any_root = 0;
  for (int r = 0; r < nforked; r++) {
    int st = rs.status[r];
    if (checks) *checks += atomic_load(&b->checks[r]);
    if (st == -1) {
      ok = 0;
      if (b->fail[r][0]) append(reason, rlen, "%s%s", reason[0] ? " | " : "", b->fail[r]);
      continue;
    }
    if (rs.expect_killed[r] && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) continue;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
      if (b->fail[r][0]) { /* reported a failure but exited 0: should not happen */
        ok = 0;
        append(reason, rlen, "%s%s", reason[0] ? " | " : "", b->fail[r]);
      }
      continue;
    }
    ok = 0;
    if (WIFSIGNALED(st)) {
      any_root = 1;
      append(reason, rlen, "%srank %d died of %s (%d) during: %s", reason[0] ? " | " : "", r, signame(WTERMSIG(st)),
             WTERMSIG(st), b->stage[r][0] ? b->stage[r] : "?");
    } else if (WEXITSTATUS(st) == 1) {
      any_root = 1;
      if (b->fail[r][0]) append(reason, rlen, "%s%s", reason[0] ? " | " : "", b->fail[r]);
      else append(reason, rlen, "%srank %d failed (no message; stage: %s)", reason[0] ? " | " : "", r, b->stage[r]);
    } else if (WEXITSTATUS(st) != 2) {
      any_root = 1;
      append(reason, rlen, "%srank %d exited with code %d (stage: %s)", reason[0] ? " | " : "", r, WEXITSTATUS(st),
             b->stage[r]);
    }
  }
  if (!ok && !any_root && !reason[0]) append(reason, rlen, "ranks aborted without a root cause (see stderr)");
  for (int r = 0; r < nforked; r++) {
    int dup = 0;
    for (int k = 0; k < r; k++) dup |= strcmp(b->detail[k], b->detail[r]) == 0;
    if (b->detail[r][0] && !dup) append(details, dlen, "%s%s", details[0] ? "; " : "", b->detail[r]);
  }
  if (shm_out) *shm_out = shm;
  else munmap(shm, spec->shm_size);
  return ok ? 0 : -1;
}

/* ------------------------------------------------------------------ two-rank kill scenarios */

int hc_kill_pair_hook(hc_runstate_t* rs) {
  hc_board_t* b = rs->shm;
  int64_t kill_ns = atomic_load(&b->kill_ns);
  if (kill_ns) {
    /* The survivor reports by itself within timeout + 5 s unless it is stuck inside a plugin call. */
    int s = 1 - rs->spec->kill_victim;
    double since = (double)(now_ns() - kill_ns) / 1e9;
    if (!rs->exited[s] && since > (rs->spec->short_timeout_ms + 5000) / 1000.0 + 10) {
      snprintf(rs->reason, sizeof rs->reason,
               "rank %d (survivor) is stuck inside a plugin call %.0f s after the peer was SIGKILLed (stage: %s); "
               "stacks on stderr",
               s, since, b->stage[s]);
      dump_stacks(rs->spec->name, s, rs->pid[s]);
      return -1;
    }
    return 0;
  }
  long long p0 = atomic_load(&b->progress[0]), p1 = atomic_load(&b->progress[1]);
  if (p0 >= 3 && p1 >= 3) {
    int v = rs->spec->kill_victim;
    atomic_store(&b->kill_ns, now_ns()); /* before the kill: an error seen after this is "after" */
    rs->expect_killed[v] = 1;
    kill(rs->pid[v], SIGKILL);
    vlog("[%s] parent SIGKILLed rank %d (pid %d) after %lld/%lld messages\n", rs->spec->name, v, (int)rs->pid[v], p0,
         p1);
    return 0;
  }
  if (now_ns() - rs->start > 40000000000LL) {
    snprintf(rs->reason, sizeof rs->reason,
             "the stream never got going (completed messages: rank0 %lld, rank1 %lld after 40 s; stages: '%s' / '%s')",
             p0, p1, b->stage[0], b->stage[1]);
    return -1;
  }
  return 0;
}

int hc_run_kill_pair(const hc_runspec_t* spec, char* reason, size_t rlen, char* details, size_t dlen,
                     long long* checks) {
  int fails = 0;
  for (int victim = 1; victim >= 0; victim--) {
    hc_runspec_t one = *spec;
    one.kill_victim = victim;
    char r1[FAIL_LEN] = "", d1[DETAIL_LEN] = "";
    if (hc_run_ranks(&one, r1, sizeof r1, d1, sizeof d1, checks, NULL) != 0) {
      fails++;
      append(reason, rlen, "%s%s killed: %s", reason[0] ? " || " : "", victim == 1 ? "receiver" : "sender", r1);
    }
    if (d1[0]) append(details, dlen, "%s%s", details[0] ? "; " : "", d1);
  }
  return fails ? -1 : 0;
}
