/*
 * net_bench: point-to-point latency and bandwidth of an NCCL net plugin between two processes.
 *
 *   net_bench --lib PATH [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-t SECONDS_PER_SIZE] [-w WINDOW]
 *             [--version 12]
 *
 * Sizes accept K/M/G suffixes (powers of 1024). Defaults: -b 8 -e 64M -f 2 -t 0.5 -w 16.
 * The parent forks two ranks before anything is dlopened; each rank dlopens the plugin, both
 * listen, exchange handles through an anonymous shared mapping, and connect to each other.
 * For every size:
 *   ping-pong: rank 0 isend, rank 1 irecv then isend back; one-way latency = elapsed/(2*iters);
 *              pp_MBps = size / one-way latency.
 *   streaming: rank 0 keeps WINDOW isends in flight, rank 1 keeps WINDOW irecvs posted; timed from
 *              the first send until rank 1's 1-byte acknowledgement of the last one arrives.
 * Each phase gets half of -t; iteration counts are calibrated from a warm-up and shared with
 * rank 1 through the mapping. MB/s are 1e6 bytes per second. Output (rank 0, stdout):
 *   #  size(B)   pp_lat_us   pp_MBps   stream_MBps
 *   %10zu %11.2f %9.1f %13.1f
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "netapi.h"
#include "two_ranks.h"

#define HSIZE NCCL_NET_HANDLE_MAXSIZE
#define MAXSIZES 64
#define MAXWINDOW 256
#define OP_TIMEOUT_NS (60LL * 1000000000LL)

static const char* g_lib;
static int g_version = 12;
static size_t g_min = 8, g_max = 64UL << 20;
static size_t g_factor = 2;
static double g_secs = 0.5;
static int g_window = 16;

struct bshm {
  atomic_int abort;
  atomic_uint hseq[2];
  unsigned char handle[2][HSIZE];
  atomic_llong pp_iters[MAXSIZES];
  atomic_llong st_iters[MAXSIZES];
  char fail[2][1024];
};

typedef struct {
  int rank;
  struct bshm* shm;
  net_t net;
  int dev;
  void *sc, *rc;
  void *smh, *rmh;
  unsigned char *sbuf, *rbuf;
  size_t cap;
} bctx_t;

static int bfail(bctx_t* c, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static int bfail(bctx_t* c, const char* fmt, ...) {
  char msg[900];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(c->shm->fail[c->rank], sizeof c->shm->fail[c->rank], "rank %d: %s", c->rank, msg);
  fprintf(stderr, "net_bench rank %d: %s\n", c->rank, msg);
  atomic_store(&c->shm->abort, 1);
  return -1;
}

static int aborted(bctx_t* c) { return atomic_load(&c->shm->abort) != 0; }

/* Spin on test() until done; no sleeping (this is a latency benchmark). */
static int wait_req(bctx_t* c, void* req, int* sizes, const char* what) {
  int64_t deadline = now_ns() + OP_TIMEOUT_NS;
  int done = 0;
  for (unsigned long k = 0;; k++) {
    ncclResult_t r = net_test(&c->net, req, &done, sizes);
    if (r != ncclSuccess) return bfail(c, "%s: test returned %d (%s)", what, r, nccl_result_str(r));
    if (done) return 0;
    if ((k & 1023) == 0 && (aborted(c) || now_ns() > deadline))
      return aborted(c) ? -1 : bfail(c, "%s: request not done after 60 s", what);
  }
}

static int post_send(bctx_t* c, size_t size, void** req, const char* what) {
  int64_t deadline = now_ns() + OP_TIMEOUT_NS;
  for (unsigned long k = 0;; k++) {
    *req = NULL;
    ncclResult_t r = net_isend(&c->net, c->sc, c->sbuf, size, 0, c->smh, req);
    if (r != ncclSuccess) return bfail(c, "%s: isend(%zu) returned %d (%s)", what, size, r, nccl_result_str(r));
    if (*req) return 0;
    if ((k & 1023) == 0 && (aborted(c) || now_ns() > deadline))
      return aborted(c) ? -1 : bfail(c, "%s: isend kept returning NULL", what);
  }
}

static int post_recv(bctx_t* c, size_t size, void** req, const char* what) {
  int64_t deadline = now_ns() + OP_TIMEOUT_NS;
  void* d = c->rbuf;
  int tag = 0;
  for (unsigned long k = 0;; k++) {
    *req = NULL;
    size_t cap = size;
    ncclResult_t r = net_irecv(&c->net, c->rc, 1, &d, &cap, &tag, &c->rmh, req);
    if (r != ncclSuccess) return bfail(c, "%s: irecv(%zu) returned %d (%s)", what, size, r, nccl_result_str(r));
    if (*req) return 0;
    if ((k & 1023) == 0 && (aborted(c) || now_ns() > deadline))
      return aborted(c) ? -1 : bfail(c, "%s: irecv kept returning NULL", what);
  }
}

/* One ping-pong round trip. */
static int pp_iter(bctx_t* c, size_t size) {
  void *rreq, *sreq;
  int rs[NCCL_PROXY_MAX_SUBS], ss = 0;
  if (c->rank == 0) {
    if (post_recv(c, size, &rreq, "ping-pong") || post_send(c, size, &sreq, "ping-pong")) return -1;
    if (wait_req(c, sreq, &ss, "ping-pong send") || wait_req(c, rreq, rs, "ping-pong recv")) return -1;
  } else {
    if (post_recv(c, size, &rreq, "ping-pong") || wait_req(c, rreq, rs, "ping-pong recv")) return -1;
    if (post_send(c, size, &sreq, "ping-pong") || wait_req(c, sreq, &ss, "ping-pong send")) return -1;
  }
  if (rs[0] != (int)size) return bfail(c, "ping-pong: received %d bytes, expected %zu", rs[0], size);
  return 0;
}

/* Keeps up to WINDOW sends (rank 0) or receives (rank 1) in flight until n have completed. */
static int stream(bctx_t* c, size_t size, long long n) {
  void* reqs[MAXWINDOW];
  int busy[MAXWINDOW];
  memset(busy, 0, sizeof busy);
  long long posted = 0, completed = 0;
  int64_t deadline = now_ns() + OP_TIMEOUT_NS;
  void* d = c->rbuf;
  int tag = 0;
  unsigned long k = 0;
  while (completed < n) {
    for (int i = 0; i < g_window; i++) {
      if (!busy[i]) {
        if (posted >= n) continue;
        void* req = NULL;
        size_t cap = size;
        ncclResult_t r = c->rank == 0 ? net_isend(&c->net, c->sc, c->sbuf, size, 0, c->smh, &req)
                                      : net_irecv(&c->net, c->rc, 1, &d, &cap, &tag, &c->rmh, &req);
        if (r != ncclSuccess)
          return bfail(c, "stream %zu: %s returned %d (%s)", size, c->rank == 0 ? "isend" : "irecv", r,
                       nccl_result_str(r));
        if (req) {
          reqs[i] = req;
          busy[i] = 1;
          posted++;
        }
        continue;
      }
      int done = 0, sizes[NCCL_PROXY_MAX_SUBS];
      ncclResult_t r = net_test(&c->net, reqs[i], &done, sizes);
      if (r != ncclSuccess) return bfail(c, "stream %zu: test returned %d (%s)", size, r, nccl_result_str(r));
      if (done) {
        if (sizes[0] != (int)size) return bfail(c, "stream %zu: test reported %d bytes", size, sizes[0]);
        busy[i] = 0;
        completed++;
        deadline = now_ns() + OP_TIMEOUT_NS;
      }
    }
    if ((++k & 1023) == 0 && (aborted(c) || now_ns() > deadline))
      return aborted(c) ? -1 : bfail(c, "stream %zu: no completion for 60 s (%lld/%lld done)", size, completed, n);
  }
  return 0;
}

static int wait_count(bctx_t* c, atomic_llong* slot, long long* out) {
  int64_t deadline = now_ns() + OP_TIMEOUT_NS;
  while ((*out = atomic_load(slot)) == 0) {
    if (aborted(c)) return -1;
    if (now_ns() > deadline) return bfail(c, "timed out waiting for rank 0's iteration count");
    sched_yield();
  }
  return 0;
}

static long long clampll(double x, long long lo, long long hi) {
  if (!(x >= (double)lo)) return lo;
  if (x > (double)hi) return hi;
  return (long long)x;
}

static int setup(bctx_t* c) {
  char err[512];
  if (net_open(&c->net, g_lib, g_version, err, sizeof err) != 0) return bfail(c, "%s", err);
  ncclResult_t r = net_init(&c->net, 0xbe4c400ULL);
  if (r != ncclSuccess) return bfail(c, "init returned %d (%s)", r, nccl_result_str(r));
  int ndev = 0;
  r = net_devices(&c->net, &ndev);
  if (r != ncclSuccess || ndev < 1) return bfail(c, "devices returned %d, ndev %d", r, ndev);
  c->dev = 0;
  unsigned char h[HSIZE], peer[HSIZE];
  void* lc = NULL;
  r = net_listen(&c->net, c->dev, h, &lc);
  if (r != ncclSuccess || !lc) return bfail(c, "listen returned %d (%s)", r, nccl_result_str(r));
  memcpy(c->shm->handle[c->rank], h, HSIZE);
  atomic_store(&c->shm->hseq[c->rank], 1);
  int64_t deadline = now_ns() + OP_TIMEOUT_NS;
  while (atomic_load(&c->shm->hseq[1 - c->rank]) != 1) {
    if (aborted(c)) return -1;
    if (now_ns() > deadline) return bfail(c, "timed out waiting for the peer's handle");
    sched_yield();
  }
  memcpy(peer, c->shm->handle[1 - c->rank], HSIZE);
  c->sc = c->rc = NULL;
  while (!c->sc || !c->rc) {
    if (!c->sc) {
      r = net_connect(&c->net, c->dev, peer, &c->sc);
      if (r != ncclSuccess) return bfail(c, "connect returned %d (%s)", r, nccl_result_str(r));
    }
    if (!c->rc) {
      r = net_accept(&c->net, lc, &c->rc);
      if (r != ncclSuccess) return bfail(c, "accept returned %d (%s)", r, nccl_result_str(r));
      if (c->rc) net_close_listen(&c->net, lc);
    }
    if (aborted(c)) return -1;
    if (now_ns() > deadline) return bfail(c, "connection setup timed out");
    if (!c->sc || !c->rc) sched_yield();
  }
  c->cap = g_max + 64;
  c->sbuf = aligned_alloc(4096, (c->cap + 4095) & ~(size_t)4095);
  c->rbuf = aligned_alloc(4096, (c->cap + 4095) & ~(size_t)4095);
  if (!c->sbuf || !c->rbuf) return bfail(c, "out of memory for %zu-byte buffers", c->cap);
  memset(c->sbuf, 0x5A, c->cap);
  memset(c->rbuf, 0, c->cap);
  r = net_regmr(&c->net, c->sc, c->sbuf, c->cap, NCCL_PTR_HOST, &c->smh);
  if (r != ncclSuccess) return bfail(c, "regMr(send) returned %d (%s)", r, nccl_result_str(r));
  r = net_regmr(&c->net, c->rc, c->rbuf, c->cap, NCCL_PTR_HOST, &c->rmh);
  if (r != ncclSuccess) return bfail(c, "regMr(recv) returned %d (%s)", r, nccl_result_str(r));
  return 0;
}

static int rank_main(bctx_t* c) {
  if (setup(c)) return -1;
  if (c->rank == 0) {
    printf("#  size(B)   pp_lat_us   pp_MBps   stream_MBps\n");
    fflush(stdout);
  }
  const double phase_secs = g_secs / 2;
  int idx = 0;
  for (size_t size = g_min; size <= g_max && idx < MAXSIZES; idx++) {
    /* ---- ping-pong ---- */
    int warm = size <= 65536 ? 20 : (size <= (4UL << 20) ? 5 : 2);
    int64_t t = now_ns();
    for (int i = 0; i < warm; i++)
      if (pp_iter(c, size)) return -1;
    long long iters;
    if (c->rank == 0) {
      double per = (double)(now_ns() - t) / warm / 1e9;
      iters = clampll(phase_secs / (per > 0 ? per : 1e-6), 3, 2000000);
      atomic_store(&c->shm->pp_iters[idx], iters);
    } else if (wait_count(c, &c->shm->pp_iters[idx], &iters)) {
      return -1;
    }
    t = now_ns();
    for (long long i = 0; i < iters; i++)
      if (pp_iter(c, size)) return -1;
    double pp_us = (double)(now_ns() - t) / 1e3 / (2.0 * (double)iters);
    /* ---- streaming ---- */
    long long swarm = size >= (16UL << 20) ? g_window : 2LL * g_window;
    t = now_ns();
    if (stream(c, size, swarm)) return -1;
    long long n;
    if (c->rank == 0) {
      double rate = (double)swarm / ((double)(now_ns() - t) / 1e9);
      n = clampll(phase_secs * rate, g_window, 50000000);
      atomic_store(&c->shm->st_iters[idx], n);
    } else if (wait_count(c, &c->shm->st_iters[idx], &n)) {
      return -1;
    }
    double st_mbps = 0;
    if (c->rank == 0) {
      void* ack;
      int as[NCCL_PROXY_MAX_SUBS];
      if (post_recv(c, 1, &ack, "stream ack")) return -1;
      t = now_ns();
      if (stream(c, size, n)) return -1;
      if (wait_req(c, ack, as, "stream ack")) return -1;
      st_mbps = (double)size * (double)n / ((double)(now_ns() - t) / 1e9) / 1e6;
    } else {
      if (stream(c, size, n)) return -1;
      void* ack;
      int ss;
      if (post_send(c, 1, &ack, "stream ack") || wait_req(c, ack, &ss, "stream ack")) return -1;
    }
    if (c->rank == 0) {
      printf("%10zu %11.2f %9.1f %13.1f\n", size, pp_us, (double)size / pp_us, st_mbps);
      fflush(stdout);
    }
    size_t next = size * g_factor;
    if (next <= size) break;
    size = next;
  }
  /* teardown: both sides idle, close */
  net_deregmr(&c->net, c->sc, c->smh);
  net_deregmr(&c->net, c->rc, c->rmh);
  net_close_send(&c->net, c->sc);
  net_close_recv(&c->net, c->rc);
  net_finalize(&c->net);
  return 0;
}

static void usage(FILE* f) {
  fprintf(f, "usage: net_bench --lib PATH [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-t SECONDS_PER_SIZE] [-w WINDOW]"
             " [--version 6..12]\n");
}

/* A forked rank (two_ranks_fork): its context over the shared mapping, then rank_main. */
static int bench_child(int rank, void* shm) {
  bctx_t c;
  memset(&c, 0, sizeof c);
  c.rank = rank;
  c.shm = shm;
  return rank_main(&c);
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "net_bench: %s needs a value\n", a);
      usage(stderr);
      return 2;
    }
    const char* v = argv[++i];
    if (!strcmp(a, "--lib")) g_lib = v;
    else if (!strcmp(a, "-b")) {
      if (two_ranks_parse_size(v, &g_min)) return fprintf(stderr, "net_bench: bad size %s\n", v), 2;
    } else if (!strcmp(a, "-e")) {
      if (two_ranks_parse_size(v, &g_max)) return fprintf(stderr, "net_bench: bad size %s\n", v), 2;
    } else if (!strcmp(a, "-f")) g_factor = (size_t)atol(v);
    else if (!strcmp(a, "-t")) g_secs = atof(v);
    else if (!strcmp(a, "-w")) g_window = atoi(v);
    else if (!strcmp(a, "--version")) g_version = atoi(v);
    else {
      fprintf(stderr, "net_bench: unknown argument %s\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (!g_lib) {
    fprintf(stderr, "net_bench: --lib PATH is required\n");
    usage(stderr);
    return 2;
  }
  if (g_min < 1 || g_max < g_min || g_max > (1UL << 30) || g_factor < 2 || !(g_secs > 0) || g_window < 1 ||
      g_window > MAXWINDOW || g_version < NET_MIN_VERSION || g_version > NET_MAX_VERSION) {
    fprintf(stderr, "net_bench: bad option value (need 1 <= -b <= -e <= 1G, -f >= 2, -t > 0, 1 <= -w <= %d)\n",
            MAXWINDOW);
    return 2;
  }
  int nsizes = 0;
  for (size_t s = g_min; s <= g_max && nsizes < MAXSIZES; s *= g_factor) nsizes++;
  struct bshm* shm = mmap(NULL, sizeof *shm, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shm == MAP_FAILED) return perror("mmap"), 1;
  memset(shm, 0, sizeof *shm);
  pid_t pid[2];
  if (two_ranks_fork(pid, bench_child, shm)) return 1;
  /* global deadline: generous per size, plus setup */
  int64_t deadline = now_ns() + (int64_t)((nsizes * (g_secs * 3 + 10) + 120) * 1e9);
  int failed = two_ranks_wait(pid, deadline, &shm->abort, "net_bench");
  for (int r = 0; r < 2; r++)
    if (shm->fail[r][0]) fprintf(stderr, "net_bench: %s\n", shm->fail[r]);
  return failed ? 1 : 0;
}
