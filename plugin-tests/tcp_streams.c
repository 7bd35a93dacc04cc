/*
 * tcp_streams: the CPU proxy of NCCL's Socket transport, for scripts/bench-p2p.sh: point-to-point
 * latency and bandwidth over K plain TCP sockets on loopback between two forked processes, each
 * socket driven by its own thread (NCCL_SOCKET_NTHREADS=K, NCCL_NSOCKS_PERTHREAD=1).
 *
 *   tcp_streams [-k SOCKETS] [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-t SECONDS_PER_SIZE]
 *               [-c MINCHUNK]
 *
 * Sizes accept K/M/G suffixes (powers of 1024). Defaults: -k 1 -b 8 -e 64M -f 2 -t 0.5 -c 64K.
 * A message of S bytes is split as NCCL's Socket transport splits it: chunks of
 * max(MINCHUNK, ceil(S/K)) bytes, chunk j on socket j (so a small message uses one socket).
 * For every size:
 *   ping-pong: each socket's thread bounces its chunk (rank 0 sends, rank 1 answers);
 *              one-way latency = elapsed/(2*iters), pp_MBps = size / one-way latency.
 *   streaming: rank 0's threads send n messages' chunks back to back, rank 1's receive them into
 *              one S-byte buffer; timed from the start until rank 1's 1-byte acknowledgement
 *              (after all its threads are done) arrives.
 * Each phase gets half of -t; iteration counts are calibrated from a warm-up and shared with rank
 * 1 through an anonymous shared mapping. Every socket call has a deadline (SO_SNDTIMEO /
 * SO_RCVTIMEO, 60 s), and so has every wait for the peer. MB/s are 1e6 bytes per second. Output
 * (rank 0, stdout), the columns of net_bench:
 *   #  size(B)   pp_lat_us   pp_MBps   stream_MBps
 *   %10zu %11.2f %9.1f %13.1f
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "two_ranks.h"

#define MAXSOCKS 16
#define MAXSIZES 64
#define OP_TIMEOUT_S 60
#define OP_TIMEOUT_NS ((int64_t)OP_TIMEOUT_S * 1000000000LL)

static int g_k = 1;
static size_t g_min = 8, g_max = 64UL << 20, g_factor = 2, g_minchunk = 64UL << 10;
static double g_secs = 0.5;

struct tshm {
  atomic_int abort;
  atomic_llong pp_iters[MAXSIZES];
  atomic_llong st_iters[MAXSIZES];
  char fail[2][512];
};

static struct tshm* g_shm;
static int g_rank;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int tfail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static int tfail(const char* fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  /* first failure wins; later ones (often consequences) go to stderr only */
  if (!g_shm->fail[g_rank][0]) snprintf(g_shm->fail[g_rank], sizeof g_shm->fail[g_rank], "rank %d: %s", g_rank, msg);
  fprintf(stderr, "tcp_streams rank %d: %s\n", g_rank, msg);
  atomic_store(&g_shm->abort, 1);
  return -1;
}

/* Move exactly len bytes; the socket's timeouts bound each call. */
static int xfer(int fd, unsigned char* p, size_t len, int send_side) {
  while (len > 0) {
    ssize_t n = send_side ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return tfail("recv: the peer closed the connection");
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      return tfail("%s: no progress for %d s (deadline)", send_side ? "send" : "recv", OP_TIMEOUT_S);
    return tfail("%s: %s", send_side ? "send" : "recv", strerror(errno));
  }
  return 0;
}

enum { PINGPONG, STREAM };

typedef struct {
  int fd;
  int phase;
  size_t off, len; /* this socket's chunk of each message */
  long long iters;
  unsigned char *sbuf, *rbuf;
  int rc;
} job_t;

static void* worker(void* arg) {
  job_t* j = arg;
  j->rc = 0;
  for (long long i = 0; i < j->iters && !j->rc; i++) {
    if (j->phase == PINGPONG) {
      if (g_rank == 0)
        j->rc = xfer(j->fd, j->sbuf + j->off, j->len, 1) || xfer(j->fd, j->rbuf + j->off, j->len, 0);
      else
        j->rc = xfer(j->fd, j->rbuf + j->off, j->len, 0) || xfer(j->fd, j->sbuf + j->off, j->len, 1);
    } else {
      j->rc = xfer(j->fd, (g_rank == 0 ? j->sbuf : j->rbuf) + j->off, j->len, g_rank == 0);
    }
    if ((i & 255) == 255 && atomic_load(&g_shm->abort)) j->rc = -1;
  }
  return NULL;
}

/* Runs `iters` messages of `size` bytes of `phase` on the sockets, one thread per chunk. */
static int run_phase(const int* fds, int phase, size_t size, long long iters, unsigned char* sbuf,
                     unsigned char* rbuf) {
  size_t chunk = (size + (size_t)g_k - 1) / (size_t)g_k;
  if (chunk < g_minchunk) chunk = g_minchunk;
  int m = (int)((size + chunk - 1) / chunk);
  if (m < 1) m = 1;
  job_t jobs[MAXSOCKS];
  pthread_t th[MAXSOCKS];
  int started = 0, rc = 0;
  for (int s = 0; s < m; s++) {
    size_t off = (size_t)s * chunk;
    jobs[s] = (job_t){fds[s], phase, off, size - off < chunk ? size - off : chunk, iters, sbuf, rbuf, 0};
    if (pthread_create(&th[s], NULL, worker, &jobs[s]) != 0) {
      rc = tfail("pthread_create failed");
      break;
    }
    started++;
  }
  for (int s = 0; s < started; s++) {
    pthread_join(th[s], NULL); /* each worker's socket calls have deadlines, so this ends */
    if (jobs[s].rc) rc = -1;
  }
  return rc;
}

static int wait_count(atomic_llong* slot, long long* out) {
  int64_t deadline = now_ns() + OP_TIMEOUT_NS;
  while ((*out = atomic_load(slot)) == 0) {
    if (atomic_load(&g_shm->abort)) return -1;
    if (now_ns() > deadline) return tfail("timed out waiting for rank 0's iteration count");
    struct timespec ts = {0, 100 * 1000};
    nanosleep(&ts, NULL);
  }
  return 0;
}

static long long clampll(double x, long long lo, long long hi) {
  if (!(x >= (double)lo)) return lo;
  if (x > (double)hi) return hi;
  return (long long)x;
}

static int sock_opts(int fd) {
  int one = 1;
  struct timeval tv = {OP_TIMEOUT_S, 0};
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) ||
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv))
    return tfail("setsockopt: %s", strerror(errno));
  return 0;
}

/* Rank 0 connects K sockets and names each with its index; rank 1 accepts them. */
static int connect_all(int lfd, const struct sockaddr_in* addr, int* fds) {
  for (int s = 0; s < g_k; s++) {
    if (g_rank == 0) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      if (fd < 0) return tfail("socket: %s", strerror(errno));
      if (sock_opts(fd)) return -1;
      if (connect(fd, (const struct sockaddr*)addr, sizeof *addr)) return tfail("connect: %s", strerror(errno));
      unsigned char idx = (unsigned char)s;
      if (xfer(fd, &idx, 1, 1)) return -1;
      fds[s] = fd;
    } else {
      /* the listening socket has a receive timeout too, so accept has a deadline */
      int fd = accept(lfd, NULL, NULL);
      if (fd < 0) return tfail("accept: %s", errno == EAGAIN ? "no connection within the deadline" : strerror(errno));
      if (sock_opts(fd)) return -1;
      unsigned char idx;
      if (xfer(fd, &idx, 1, 0)) return -1;
      if (idx >= g_k || fds[idx] >= 0) return tfail("accept: bad socket index %u", idx);
      fds[idx] = fd;
    }
  }
  return 0;
}

static int rank_main(int lfd, const struct sockaddr_in* addr) {
  int fds[MAXSOCKS];
  for (int s = 0; s < MAXSOCKS; s++) fds[s] = -1;
  if (connect_all(lfd, addr, fds)) return -1;
  size_t cap = (g_max + 4095) & ~(size_t)4095;
  unsigned char* sbuf = aligned_alloc(4096, cap);
  unsigned char* rbuf = aligned_alloc(4096, cap);
  if (!sbuf || !rbuf) return tfail("out of memory for %zu-byte buffers", cap);
  memset(sbuf, 0x5A, cap);
  memset(rbuf, 0, cap);
  if (g_rank == 0) {
    printf("# tcp_streams: %d socket(s), one thread each, chunks of max(%zu, size/%d) bytes\n", g_k, g_minchunk, g_k);
    printf("#  size(B)   pp_lat_us   pp_MBps   stream_MBps\n");
    fflush(stdout);
  }
  const double phase_secs = g_secs / 2;
  int idx = 0;
  for (size_t size = g_min; size <= g_max && idx < MAXSIZES; idx++) {
    /* ---- ping-pong ---- */
    long long warm = size <= 65536 ? 20 : (size <= (4UL << 20) ? 5 : 2);
    int64_t t = now_ns();
    if (run_phase(fds, PINGPONG, size, warm, sbuf, rbuf)) return -1;
    long long iters;
    if (g_rank == 0) {
      double per = (double)(now_ns() - t) / (double)warm / 1e9;
      iters = clampll(phase_secs / (per > 0 ? per : 1e-6), 3, 2000000);
      atomic_store(&g_shm->pp_iters[idx], iters);
    } else if (wait_count(&g_shm->pp_iters[idx], &iters)) {
      return -1;
    }
    t = now_ns();
    if (run_phase(fds, PINGPONG, size, iters, sbuf, rbuf)) return -1;
    double pp_us = (double)(now_ns() - t) / 1e3 / (2.0 * (double)iters);
    /* ---- streaming ---- */
    long long swarm = size >= (16UL << 20) ? 16 : 32;
    t = now_ns();
    if (run_phase(fds, STREAM, size, swarm, sbuf, rbuf)) return -1;
    long long n;
    if (g_rank == 0) {
      double rate = (double)swarm / ((double)(now_ns() - t) / 1e9);
      n = clampll(phase_secs * rate, 16, 50000000);
      atomic_store(&g_shm->st_iters[idx], n);
    } else if (wait_count(&g_shm->st_iters[idx], &n)) {
      return -1;
    }
    unsigned char ack = 1;
    t = now_ns();
    if (run_phase(fds, STREAM, size, n, sbuf, rbuf)) return -1;
    if (xfer(fds[0], &ack, 1, g_rank == 1)) return -1;
    if (g_rank == 0) {
      double st_mbps = (double)size * (double)n / ((double)(now_ns() - t) / 1e9) / 1e6;
      printf("%10zu %11.2f %9.1f %13.1f\n", size, pp_us, (double)size / pp_us, st_mbps);
      fflush(stdout);
    }
    size_t next = size * g_factor;
    if (next <= size) break;
    size = next;
  }
  for (int s = 0; s < g_k; s++) close(fds[s]);
  free(sbuf);
  free(rbuf);
  return 0;
}

static void usage(FILE* f) {
  fprintf(f, "usage: tcp_streams [-k SOCKETS 1..%d] [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-t SECONDS_PER_SIZE]"
             " [-c MINCHUNK]\n", MAXSOCKS);
}

struct listener {
  int fd;
  const struct sockaddr_in* addr;
};

/* A forked rank (two_ranks_fork): rank 0 connects and so needs no listening socket. */
static int streams_child(int rank, void* arg) {
  const struct listener* l = arg;
  g_rank = rank;
  if (rank == 0) close(l->fd);
  return rank_main(l->fd, l->addr);
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "tcp_streams: %s needs a value\n", a);
      usage(stderr);
      return 2;
    }
    const char* v = argv[++i];
    int bad = 0;
    if (!strcmp(a, "-k")) g_k = atoi(v);
    else if (!strcmp(a, "-b")) bad = two_ranks_parse_size(v, &g_min);
    else if (!strcmp(a, "-e")) bad = two_ranks_parse_size(v, &g_max);
    else if (!strcmp(a, "-c")) bad = two_ranks_parse_size(v, &g_minchunk);
    else if (!strcmp(a, "-f")) g_factor = (size_t)atol(v);
    else if (!strcmp(a, "-t")) g_secs = atof(v);
    else {
      fprintf(stderr, "tcp_streams: unknown argument %s\n", a);
      usage(stderr);
      return 2;
    }
    if (bad) return fprintf(stderr, "tcp_streams: %s: bad size %s\n", a, v), 2;
  }
  if (g_k < 1 || g_k > MAXSOCKS || g_min < 1 || g_max < g_min || g_max > (1UL << 30) || g_factor < 2 ||
      !(g_secs > 0) || g_minchunk < 1) {
    fprintf(stderr, "tcp_streams: bad option value (need 1 <= -k <= %d, 1 <= -b <= -e <= 1G, -f >= 2, -t > 0, -c >= 1)\n",
            MAXSOCKS);
    return 2;
  }
  int nsizes = 0;
  for (size_t s = g_min; s <= g_max && nsizes < MAXSIZES; s *= g_factor) nsizes++;
  g_shm = mmap(NULL, sizeof *g_shm, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g_shm == MAP_FAILED) return perror("mmap"), 1;
  memset(g_shm, 0, sizeof *g_shm);
  /* the listener exists before the fork, so rank 0 can connect whenever it starts */
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof addr;
  struct timeval tv = {OP_TIMEOUT_S, 0};
  if (lfd < 0 || bind(lfd, (struct sockaddr*)&addr, sizeof addr) || listen(lfd, MAXSOCKS) ||
      getsockname(lfd, (struct sockaddr*)&addr, &alen) || setsockopt(lfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv))
    return perror("tcp_streams: listening socket on 127.0.0.1"), 1;
  struct listener l = {lfd, &addr};
  pid_t pid[2];
  if (two_ranks_fork(pid, streams_child, &l)) return 1;
  close(lfd);
  /* global deadline: generous per size, plus setup */
  int64_t deadline = now_ns() + (int64_t)((nsizes * (g_secs * 3 + 10) + 60) * 1e9);
  int failed = two_ranks_wait(pid, deadline, &g_shm->abort, "tcp_streams");
  for (int r = 0; r < 2; r++)
    if (g_shm->fail[r][0]) fprintf(stderr, "tcp_streams: %s\n", g_shm->fail[r]);
  return failed ? 1 : 0;
}
