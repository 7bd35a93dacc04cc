/*
 * bench_core.c: the two-rank measuring engine of rma_raw and neuron_bench (see bench_core.h):
 * option parsing, forking, the exchange through a shared mapping, bounded posts and waits, and
 * the latency / windowed-bandwidth loops with their iteration calibration.
 */
#include "bench_core.h"
#include "two_ranks.h"

#include <errno.h>
#include <sched.h>
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

int64_t bench_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int bench_alloc(bench_t* b) {
  b->cap = b->cfg->max + BENCH_CTL_BYTES;
  size_t alloc = (b->cap + 4095) & ~(size_t)4095;
  b->sbuf = aligned_alloc(4096, alloc);
  b->rbuf = aligned_alloc(4096, alloc);
  if (!b->sbuf || !b->rbuf) return bench_fail(b, "out of memory for two %zu-byte buffers", b->cap);
  memset(b->sbuf, 0x5A, b->cap);
  memset(b->rbuf, 0, b->cap);
  return 0;
}

int bench_fail(bench_t* b, const char* fmt, ...) {
  char msg[900];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(b->shm->fail[b->rank], sizeof b->shm->fail[b->rank], "rank %d: %s", b->rank, msg);
  atomic_store(&b->shm->abort, 1);
  return -1;
}

int bench_aborted(bench_t* b) { return atomic_load(&b->shm->abort) != 0; }

const char* bench_op_name(enum bench_op op) {
  switch (op) {
  case BOP_SEND: return "send";
  case BOP_RECV: return "recv";
  case BOP_WRITE: return "write";
  case BOP_READ: return "read";
  case BOP_INLINE: return "inline";
  case BOP_CTL_SEND: return "ctl-send";
  case BOP_CTL_RECV: return "ctl-recv";
  }
  return "?";
}

static int64_t deadline_of(bench_t* b) { return bench_now_ns() + b->cfg->timeout_ms * 1000000LL; }

/* Every 1024 polls: has the peer failed, or has the deadline passed? -1 after reporting it. */
static int check_deadline(bench_t* b, unsigned long k, int64_t deadline, const char* what) {
  if ((k & 1023) != 0) return 0;
  if (bench_aborted(b)) return -1;
  if (bench_now_ns() > deadline)
    return bench_fail(b, "%s: nothing happened for %lld ms (--timeout-ms)", what, b->cfg->timeout_ms);
  return 0;
}

int bench_exchange(bench_t* b, const void* mine, size_t len, void* peer) {
  if (len > BENCH_XCHG_BYTES) return bench_fail(b, "exchange of %zu bytes (limit %d)", len, BENCH_XCHG_BYTES);
  unsigned seq = atomic_load(&b->shm->xseq[b->rank]) + 1;
  int64_t deadline = deadline_of(b);
  /* our slot may be overwritten only once the peer has copied what we put there last time */
  for (unsigned long k = 0; atomic_load(&b->shm->xack[1 - b->rank]) + 1 < seq; k++) {
    if (check_deadline(b, k, deadline, "waiting for the peer to read our last exchange")) return -1;
    sched_yield();
  }
  memcpy(b->shm->xchg[b->rank], mine, len);
  atomic_store(&b->shm->xseq[b->rank], seq);
  for (unsigned long k = 0; atomic_load(&b->shm->xseq[1 - b->rank]) < seq; k++) {
    if (check_deadline(b, k, deadline, "waiting for the peer's exchange")) return -1;
    sched_yield();
  }
  memcpy(peer, b->shm->xchg[1 - b->rank], len);
  atomic_store(&b->shm->xack[b->rank], seq);
  return 0;
}

int bench_post(bench_t* b, enum bench_op op, size_t size, void** tok, const char* what) {
  int64_t deadline = deadline_of(b);
  for (unsigned long k = 0;; k++) {
    int r = b->ops->post(b, op, size, tok);
    if (r < 0) return -1;
    if (r == 0) return 0;
    if (check_deadline(b, k, deadline, what)) return -1;
  }
}

/* bench_wait with `extra_ns` more than --timeout-ms. */
static int wait_longer(bench_t* b, void* tok, size_t* bytes, const char* what, int64_t extra_ns) {
  int64_t deadline = deadline_of(b) + extra_ns;
  int done = 0;
  for (unsigned long k = 0;; k++) {
    if (b->ops->test(b, tok, &done, bytes)) return -1;
    if (done) return 0;
    if (check_deadline(b, k, deadline, what)) return -1;
  }
}

int bench_wait(bench_t* b, void* tok, size_t* bytes, const char* what) { return wait_longer(b, tok, bytes, what, 0); }

static long long clampll(double x, long long lo, long long hi) {
  if (!(x >= (double)lo)) return lo;
  if (x > (double)hi) return hi;
  return (long long)x;
}

/* Rank 0 publishes a count in `slot`; rank 1 waits for it. */
static int share_count(bench_t* b, atomic_llong* slot, long long* n) {
  if (b->rank == 0) {
    atomic_store(slot, *n);
    return 0;
  }
  int64_t deadline = deadline_of(b);
  for (unsigned long k = 0; (*n = atomic_load(slot)) == 0; k++) {
    if (check_deadline(b, k, deadline, "waiting for rank 0's iteration count")) return -1;
    sched_yield();
  }
  return 0;
}

/* Keeps up to WINDOW ops in flight until n have completed; receives must report `size` bytes. */
static int stream(bench_t* b, enum bench_op op, size_t size, long long n) {
  void* toks[BENCH_MAXWINDOW];
  int busy[BENCH_MAXWINDOW] = {0};
  long long posted = 0, completed = 0;
  int64_t deadline = deadline_of(b);
  char what[64];
  snprintf(what, sizeof what, "%s %zu B window", bench_op_name(op), size);
  for (unsigned long k = 0; completed < n; k++) {
    for (int i = 0; i < b->cfg->window; i++) {
      if (!busy[i]) {
        if (posted >= n) continue;
        int r = b->ops->post(b, op, size, &toks[i]);
        if (r < 0) return -1;
        if (r == 0) busy[i] = 1, posted++;
        continue;
      }
      int done = 0;
      size_t got = size;
      if (b->ops->test(b, toks[i], &done, &got)) return -1;
      if (!done) continue;
      if (op == BOP_RECV && got != size) return bench_fail(b, "%s: completed with %zu bytes", what, got);
      busy[i] = 0;
      completed++;
      deadline = deadline_of(b);
    }
    if (check_deadline(b, k, deadline, what)) return -1;
  }
  return 0;
}

/* One op at a time, n times (one-sided ops; rank 0). */
static int serial(bench_t* b, enum bench_op op, size_t size, long long n) {
  for (long long i = 0; i < n; i++) {
    void* tok;
    size_t got = size;
    if (bench_post(b, op, size, &tok, bench_op_name(op)) || bench_wait(b, tok, &got, bench_op_name(op))) return -1;
  }
  return 0;
}

/* One ping-pong round trip of `size` bytes. */
static int pp_iter(bench_t* b, size_t size) {
  void *rt, *st;
  size_t got = 0, sent;
  if (b->rank == 0) {
    if (bench_post(b, BOP_RECV, size, &rt, "ping-pong recv") || bench_post(b, BOP_SEND, size, &st, "ping-pong send") ||
        bench_wait(b, st, &sent, "ping-pong send") || bench_wait(b, rt, &got, "ping-pong recv"))
      return -1;
  } else {
    if (bench_post(b, BOP_RECV, size, &rt, "ping-pong recv") || bench_wait(b, rt, &got, "ping-pong recv") ||
        bench_post(b, BOP_SEND, size, &st, "ping-pong send") || bench_wait(b, st, &sent, "ping-pong send"))
      return -1;
  }
  if (got != size) return bench_fail(b, "ping-pong: received %zu bytes, expected %zu", got, size);
  return 0;
}

static int warm_count(size_t size) { return size <= 65536 ? 20 : (size <= (4UL << 20) ? 5 : 2); }

/* Send/recv between both ranks: ping-pong latency, then streaming bandwidth (net_bench's method). */
static int measure_send(bench_t* b, size_t size, atomic_llong* slots, double* lat_us, double* gbps) {
  double phase = b->cfg->secs / 2;
  int warm = warm_count(size);
  int64_t t = bench_now_ns();
  for (int i = 0; i < warm; i++)
    if (pp_iter(b, size)) return -1;
  double per = (double)(bench_now_ns() - t) / warm / 1e9;
  long long iters = clampll(phase / (per > 0 ? per : 1e-6), 3, 2000000);
  if (share_count(b, &slots[0], &iters)) return -1;
  t = bench_now_ns();
  for (long long i = 0; i < iters; i++)
    if (pp_iter(b, size)) return -1;
  *lat_us = (double)(bench_now_ns() - t) / 1e3 / (2.0 * (double)iters);
  enum bench_op op = b->rank == 0 ? BOP_SEND : BOP_RECV;
  long long swarm = size >= (16UL << 20) ? b->cfg->window : 2LL * b->cfg->window;
  t = bench_now_ns();
  if (stream(b, op, size, swarm)) return -1;
  long long n = clampll(phase * (double)swarm / ((double)(bench_now_ns() - t) / 1e9), b->cfg->window, 50000000);
  if (share_count(b, &slots[1], &n)) return -1;
  void* ack;
  size_t got;
  if (b->rank == 0) {
    if (bench_post(b, BOP_CTL_RECV, 1, &ack, "stream ack")) return -1;
    t = bench_now_ns();
    if (stream(b, op, size, n) || bench_wait(b, ack, &got, "stream ack")) return -1;
    *gbps = (double)size * (double)n / (double)(bench_now_ns() - t);
  } else if (stream(b, op, size, n) || bench_post(b, BOP_CTL_SEND, 1, &ack, "stream ack") ||
             bench_wait(b, ack, &got, "stream ack")) {
    return -1;
  }
  return 0;
}

/* A one-sided op issued by rank 0 while rank 1 progresses, waiting on a control receive. */
static int measure_one_sided(bench_t* b, enum bench_op op, size_t size, double* lat_us, double* gbps) {
  void* ctl;
  size_t got;
  if (b->rank == 1) /* rank 0 measures for about -t meanwhile: allow a few times that on top */
    return bench_post(b, BOP_CTL_RECV, 1, &ctl, "control recv") ||
                   wait_longer(b, ctl, &got, "control recv", (int64_t)(4 * b->cfg->secs * 1e9))
               ? -1
               : 0;
  double phase = b->cfg->secs / 2;
  int warm = warm_count(size);
  int64_t t = bench_now_ns();
  if (serial(b, op, size, warm)) return -1;
  double per = (double)(bench_now_ns() - t) / warm / 1e9;
  long long iters = clampll(phase / (per > 0 ? per : 1e-6), 3, 2000000);
  t = bench_now_ns();
  if (serial(b, op, size, iters)) return -1;
  *lat_us = (double)(bench_now_ns() - t) / 1e3 / (double)iters;
  long long swarm = size >= (16UL << 20) ? b->cfg->window : 2LL * b->cfg->window;
  t = bench_now_ns();
  if (stream(b, op, size, swarm)) return -1;
  long long n = clampll(phase * (double)swarm / ((double)(bench_now_ns() - t) / 1e9), b->cfg->window, 50000000);
  t = bench_now_ns();
  if (stream(b, op, size, n)) return -1;
  *gbps = (double)size * (double)n / (double)(bench_now_ns() - t);
  return bench_post(b, BOP_CTL_SEND, 1, &ctl, "control send") || bench_wait(b, ctl, &got, "control send") ? -1 : 0;
}

static unsigned char pattern(int rank, int i) { return (unsigned char)(i * 7 + 1 + rank * 101); }

int bench_verify(bench_t* b, int read, int write) {
  enum { N = 64 };
  for (int i = 0; i < N; i++) b->sbuf[i] = pattern(b->rank, i), b->rbuf[i] = 0;
  char dummy = 0, peer;
  if (bench_exchange(b, &dummy, 1, &peer)) return -1; /* both buffers are ready */
  void* tok;
  size_t got;
  if (b->rank == 1) {
    if (bench_post(b, BOP_CTL_RECV, 1, &tok, "verify") || bench_wait(b, tok, &got, "verify")) return -1;
    for (int i = 0; write && i < N; i++)
      if (b->rbuf[i] != pattern(0, i))
        return bench_fail(b, "verify: byte %d written by rank 0 is %#x, expected %#x", i, b->rbuf[i], pattern(0, i));
  } else {
    if (read && (bench_post(b, BOP_READ, N, &tok, "verify read") || bench_wait(b, tok, &got, "verify read")))
      return -1;
    for (int i = 0; read && i < N; i++)
      if (b->rbuf[i] != pattern(1, i))
        return bench_fail(b, "verify: byte %d read from rank 1 is %#x, expected %#x", i, b->rbuf[i], pattern(1, i));
    if (write && (bench_post(b, BOP_WRITE, N, &tok, "verify write") || bench_wait(b, tok, &got, "verify write")))
      return -1;
    if (bench_post(b, BOP_CTL_SEND, 1, &tok, "verify") || bench_wait(b, tok, &got, "verify")) return -1;
  }
  return bench_exchange(b, &dummy, 1, &peer);
}

int bench_sweep(bench_t* b, const enum bench_op* ops, const size_t* limit, int nops) {
  const bench_cfg_t* c = b->cfg;
  if (nops > 8) return bench_fail(b, "bench_sweep: %d ops (at most 8)", nops);
  if (b->rank == 0) {
    printf("#  size(B)     op      lat_us       GBps\n");
    fflush(stdout);
  }
  size_t size = c->nlist ? c->list[0] : c->min;
  for (int idx = 0; idx < BENCH_MAXSIZES; idx++) {
    for (int k = 0; k < nops; k++) {
      if (size > limit[k]) continue;
      double lat = 0, gbps = 0;
      int r = ops[k] == BOP_SEND ? measure_send(b, size, b->shm->iters[idx][k], &lat, &gbps)
                                 : measure_one_sided(b, ops[k], size, &lat, &gbps);
      if (r) return -1;
      if (b->rank == 0) {
        printf("%10zu %6s %11.3f %10.4f\n", size, bench_op_name(ops[k]), lat, gbps);
        fflush(stdout);
      }
    }
    if (c->nlist) {
      if (idx + 1 >= c->nlist) break;
      size = c->list[idx + 1];
    } else {
      size_t next = size * c->factor;
      if (next <= size || next > c->max) break;
      size = next;
    }
  }
  return 0;
}

int bench_run(bench_t* b, const enum bench_op* ops, const size_t* limit, int nops) {
  int has_read = 0, has_write = 0;
  for (int k = 0; k < nops; k++) {
    has_read |= ops[k] == BOP_READ;
    has_write |= ops[k] == BOP_WRITE;
  }
  char dummy = 0, peer;
  return bench_verify(b, has_read, has_write) || bench_sweep(b, ops, limit, nops) ||
                 bench_exchange(b, &dummy, 1, &peer)
             ? -1
             : 0;
}

/* Sizes as the two-rank tools take them, and at least 1 byte. */
static int parse_size(const char* s, size_t* out) {
  return two_ranks_parse_size(s, out) || *out < 1 ? -1 : 0;
}

int bench_parse_ops(const char* prog, const char* list, const enum bench_op* allowed, int nallowed,
                    enum bench_op* out, int max) {
  char buf[128], names[128] = "";
  for (int k = 0, n = 0; k < nallowed; k++)
    n += snprintf(names + n, sizeof names - (size_t)n, "%s%s", k ? ", " : "", bench_op_name(allowed[k]));
  snprintf(buf, sizeof buf, "%s", list);
  int n = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    int k = 0;
    while (k < nallowed && strcmp(t, bench_op_name(allowed[k]))) k++;
    if (k == nallowed || n >= max)
      return fprintf(stderr, "%s: -o '%s': expected at most %d of %s\n", prog, list, max, names), -1;
    out[n++] = allowed[k];
  }
  if (!n) return fprintf(stderr, "%s: -o is empty (expected some of %s)\n", prog, names), -1;
  return n;
}

static int parse_list(const char* s, bench_cfg_t* c) {
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", s);
  c->nlist = 0;
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (c->nlist >= BENCH_MAXSIZES || parse_size(tok, &c->list[c->nlist])) return -1;
    c->nlist++;
  }
  return c->nlist ? 0 : -1;
}

int bench_parse(int argc, char** argv, bench_cfg_t* c, const char* prog, const char* usage,
                int (*extra)(const char* opt, const char* val)) {
  *c = (bench_cfg_t){.min = 8, .max = 64UL << 20, .factor = 2, .secs = 0.5, .window = 16, .timeout_ms = 60000};
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) return printf("usage: %s\n", usage), 1;
    static const char* const common[] = {"-b", "-e", "-s", "-f", "-t", "-w", "--timeout-ms"};
    int is_common = 0;
    for (size_t k = 0; k < sizeof common / sizeof common[0]; k++) is_common |= !strcmp(a, common[k]);
    if (!is_common) {
      int used = extra(a, i + 1 < argc ? argv[i + 1] : NULL);
      if (used < 0) return fprintf(stderr, "usage: %s\n", usage), 2;
      i += used;
      continue;
    }
    if (i + 1 >= argc) return fprintf(stderr, "%s: %s needs a value\nusage: %s\n", prog, a, usage), 2;
    const char* v = argv[++i];
    char* end = NULL;
    int bad = 0;
    if (!strcmp(a, "-b")) bad = parse_size(v, &c->min);
    else if (!strcmp(a, "-e")) bad = parse_size(v, &c->max);
    else if (!strcmp(a, "-s")) bad = parse_list(v, c);
    else if (!strcmp(a, "-f")) c->factor = strtoul(v, &end, 10), bad = *end || c->factor < 2;
    else if (!strcmp(a, "-t")) c->secs = strtod(v, &end), bad = *end || !(c->secs > 0 && c->secs <= 3600);
    else if (!strcmp(a, "-w"))
      c->window = (int)strtol(v, &end, 10), bad = *end || c->window < 1 || c->window > BENCH_MAXWINDOW;
    else c->timeout_ms = strtoll(v, &end, 10), bad = *end || c->timeout_ms < 1;
    if (bad) return fprintf(stderr, "%s: bad value '%s' for %s\nusage: %s\n", prog, v, a, usage), 2;
  }
  if (c->max < c->min || c->max > (1UL << 30))
    return fprintf(stderr, "%s: need 1 <= -b <= -e <= 1G (got -b %zu -e %zu)\n", prog, c->min, c->max), 2;
  if (c->nlist) {
    c->max = 0;
    for (int i = 0; i < c->nlist; i++)
      if (c->list[i] > c->max) c->max = c->list[i];
    if (c->max > (1UL << 30)) return fprintf(stderr, "%s: -s sizes must be <= 1G\n", prog), 2;
  }
  return 0;
}

struct fork_arg {
  struct bench_shm* shm;
  const bench_cfg_t* cfg;
  int (*rank_main)(bench_t* b);
};

/* A forked rank: its context, the tool's rank_main, its buffers freed. */
static int bench_child(int rank, void* arg) {
  const struct fork_arg* a = arg;
  bench_t b = {.rank = rank, .shm = a->shm, .cfg = a->cfg};
  int rc = a->rank_main(&b);
  free(b.sbuf);
  free(b.rbuf);
  return rc;
}

int bench_fork(const bench_cfg_t* cfg, const char* prog, int (*rank_main)(bench_t* b)) {
  struct bench_shm* shm = mmap(NULL, sizeof *shm, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shm == MAP_FAILED) return perror("mmap"), 1;
  memset(shm, 0, sizeof *shm);
  int nsizes = cfg->nlist;
  for (size_t s = cfg->min; !cfg->nlist && s <= cfg->max && nsizes < BENCH_MAXSIZES; s *= cfg->factor) nsizes++;
  struct fork_arg a = {.shm = shm, .cfg = cfg, .rank_main = rank_main};
  pid_t pid[2];
  if (two_ranks_fork(pid, bench_child, &a)) return 1;
  /* global deadline: four ops per size at a few times -t each, plus set-up and one wait's timeout */
  int64_t deadline =
      bench_now_ns() + (int64_t)((nsizes * 4 * (cfg->secs * 4 + 5) + 60) * 1e9) + cfg->timeout_ms * 1000000LL;
  int failed = two_ranks_wait(pid, deadline, &shm->abort, prog);
  for (int r = 0; r < 2; r++)
    if (shm->fail[r][0]) fprintf(stderr, "%s: %s\n", prog, shm->fail[r]);
  return failed ? 1 : 0;
}
