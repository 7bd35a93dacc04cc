/*
 * neuron_bench: point-to-point latency and bandwidth through the Neuron plugin's
 * ncclNetPlugin_v6 table (libnccom-net.so) between two local processes: isend/irecv, and the
 * RMA slots iwrite, iread and iwriteInline (sizes up to max_write_inline_size) when the plugin
 * reports rma_supported = 1. The same loops and table as rma_raw (bench_core.h), so the two
 * compare row by row.
 *
 *   neuron_bench [--lib PATH] [-o send,write,read,inline]
 *                [-b MIN] [-e MAX] [-f FACTOR] [-s SIZE,SIZE..] [-t SECS] [-w WINDOW] [--timeout-ms MS]
 *
 * The library: --lib, else $FABRICOLL_NEURON_LIB, else ../../target/release/libnccom-net.so
 * next to this program (plugin-tests/build/). The provider comes from the plugin's own
 * environment (FABRICOLL_PROVIDER, FABRICOLL_DOMAIN). Each rank dlopens the library, inits it,
 * listens, and the ranks exchange handles, then connect/accept (non-blocking in v6) until both
 * comms exist. Each rank registers its send buffer on its send comm and its receive buffer on
 * its receive comm and publishes both addresses and getMrKey keys: rank 0 iwrites from its send
 * buffer into rank 1's receive buffer and ireads rank 1's send buffer into its receive buffer.
 * Lines starting with '#' give the library and the properties. Set NEURON_BENCH_VERBOSE=1 to
 * see the plugin's INFO and TRACE log lines (WARN lines always go to stderr).
 */
#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_core.h"
#include "neuron_net.h"

static const char* g_lib;
static enum bench_op g_ops[4] = {BOP_SEND, BOP_WRITE, BOP_READ, BOP_INLINE};
static int g_nops = 4;
static const char* USAGE =
    "neuron_bench [--lib PATH] [-o send,write,read,inline] [-b MIN] [-e MAX] [-f FACTOR] [-s SIZE,..]"
    " [-t SECS] [-w WINDOW] [--timeout-ms MS]";

typedef struct {
  void* dl;
  const ncclNet_v6_t* t;
  ncclNetProperties_v6_t props;
  int inited;
  void *sc, *rc, *smh, *rmh;
  uint64_t peer_saddr, peer_raddr, peer_skey, peer_rkey;
} nb_t;

/* What the ranks exchange after connecting. */
typedef struct {
  uint64_t saddr, raddr, skey, rkey;
} card_t;

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  static int verbose = -1;
  if (verbose < 0) verbose = getenv("NEURON_BENCH_VERBOSE") && atoi(getenv("NEURON_BENCH_VERBOSE")) > 0;
  if (level != NCCL_LOG_WARN && !verbose) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "neuron_bench[%d] plugin %s (flags %#lx) %s:%d: ", (int)getpid(),
          level == NCCL_LOG_WARN ? "WARN" : "log", flags, file ? file : "?", line);
  if (fmt) vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static int extra_opt(const char* a, const char* v) {
  if (!v) return fprintf(stderr, "neuron_bench: %s needs a value\n", a), -1;
  if (!strcmp(a, "--lib")) {
    g_lib = v;
  } else if (!strcmp(a, "-o")) {
    static const enum bench_op allowed[] = {BOP_SEND, BOP_WRITE, BOP_READ, BOP_INLINE};
    g_nops = bench_parse_ops("neuron_bench", v, allowed, 4, g_ops, 4);
    if (g_nops < 0) return -1;
  } else {
    return fprintf(stderr, "neuron_bench: unknown argument %s\n", a), -1;
  }
  return 1;
}

static int nfail(bench_t* b, const char* what, ncclResult_t r) {
  static const char* const names[] = {"Success",          "UnhandledCudaError", "SystemError", "InternalError",
                                      "InvalidArgument",  "InvalidUsage",       "RemoteError"};
  return bench_fail(b, "%s returned %d (%s)", what, (int)r, (unsigned)r < 7 ? names[r] : "?");
}

static int nb_post(bench_t* b, enum bench_op op, size_t size, void** tok) {
  nb_t* x = b->ctx;
  const ncclNet_v6_t* t = x->t;
  unsigned char *sctl = b->sbuf + b->cap - BENCH_CTL_BYTES, *rctl = b->rbuf + b->cap - BENCH_CTL_BYTES;
  void* req = NULL;
  void* data = op == BOP_CTL_RECV ? (void*)rctl : (void*)b->rbuf;
  int isize = op == BOP_CTL_RECV ? 1 : (int)size, tag = 0;
  ncclResult_t r;
  switch (op) {
  case BOP_SEND: r = t->isend(x->sc, b->sbuf, (int)size, 0, x->smh, &req); break;
  case BOP_CTL_SEND: r = t->isend(x->sc, sctl, 1, 0, x->smh, &req); break;
  case BOP_RECV:
  case BOP_CTL_RECV: r = t->irecv(x->rc, 1, &data, &isize, &tag, &x->rmh, &req); break;
  case BOP_WRITE: r = t->iwrite(x->sc, b->sbuf, size, x->smh, x->peer_raddr, x->peer_rkey, &req); break;
  case BOP_INLINE: r = t->iwriteInline(x->sc, b->sbuf, size, x->peer_raddr, x->peer_rkey, &req); break;
  case BOP_READ: r = t->iread(x->rc, b->rbuf, size, x->rmh, x->peer_saddr, x->peer_skey, &req); break;
  default: return bench_fail(b, "neuron_bench: op %s not supported", bench_op_name(op));
  }
  if (r != ncclSuccess) {
    char what[64];
    snprintf(what, sizeof what, "%s(%zu B)", bench_op_name(op), size);
    return nfail(b, what, r);
  }
  if (!req) return 1; /* Success with a NULL request: busy, call again */
  *tok = req;
  return 0;
}

static int nb_test(bench_t* b, void* tok, int* done, size_t* bytes) {
  nb_t* x = b->ctx;
  int sizes[8] = {0};
  ncclResult_t r = x->t->test(tok, done, sizes);
  if (r != ncclSuccess) return nfail(b, "test", r);
  if (*done) *bytes = sizes[0] < 0 ? 0 : (size_t)sizes[0];
  return 0;
}

static const bench_ops_t NB_OPS = {nb_post, nb_test};

/* The library path: --lib, $FABRICOLL_NEURON_LIB, or the repository's target/release. */
static const char* lib_path(char* buf, size_t len) {
  if (g_lib) return g_lib;
  const char* env = getenv("FABRICOLL_NEURON_LIB");
  if (env && *env) return env;
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return "libnccom-net.so";
  exe[n] = 0;
  snprintf(buf, len, "%s/../../target/release/libnccom-net.so", dirname(exe));
  return buf;
}

static int open_lib(bench_t* b, nb_t* x) {
  char buf[PATH_MAX + 64];
  const char* path = lib_path(buf, sizeof buf);
  x->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!x->dl) return bench_fail(b, "dlopen(%s) failed: %s (set --lib or FABRICOLL_NEURON_LIB)", path, dlerror());
  x->t = dlsym(x->dl, "ncclNetPlugin_v6");
  if (!x->t) return bench_fail(b, "%s exports no ncclNetPlugin_v6: %s", path, dlerror());
  const ncclNet_v6_t* t = x->t;
  if (!t->init || !t->fini || !t->devices || !t->getProperties || !t->listen || !t->connect || !t->accept ||
      !t->regMr || !t->deregMr || !t->isend || !t->irecv || !t->test || !t->closeSend || !t->closeRecv ||
      !t->closeListen || !t->getMrKey || !t->iwrite || !t->iwriteInline || !t->iread)
    return bench_fail(b, "%s: ncclNetPlugin_v6 has a NULL slot", path);
  ncclResult_t r = t->init(logger);
  if (r != ncclSuccess) return nfail(b, "init", r);
  x->inited = 1;
  int ndev = 0;
  if ((r = t->devices(&ndev)) != ncclSuccess) return nfail(b, "devices", r);
  if (ndev < 1) return bench_fail(b, "devices reported %d devices", ndev);
  if ((r = t->getProperties(0, &x->props)) != ncclSuccess) return nfail(b, "getProperties", r);
  if (b->rank == 0) {
    const ncclNetProperties_v6_t* p = &x->props;
    printf("# neuron_bench: %s, table \"%s\", device 0 \"%s\"\n", path, t->name ? t->name : "(null)",
           p->name ? p->name : "(null)");
    printf("# speed %d Mbps, latency %.1f us, rma_supported %d, max_write_inline_size %zu, max_mr_key_size %zu\n",
           p->speed, p->latency, p->rma_supported, p->max_write_inline_size, p->max_mr_key_size);
    fflush(stdout);
  }
  return 0;
}

static int connect_both(bench_t* b, nb_t* x) {
  const ncclNet_v6_t* t = x->t;
  unsigned char h[NCCL_NET_HANDLE_MAXSIZE] = {0}, peer[NCCL_NET_HANDLE_MAXSIZE];
  void* lc = NULL;
  ncclResult_t r = t->listen(0, h, &lc);
  if (r != ncclSuccess || !lc) return r != ncclSuccess ? nfail(b, "listen", r) : bench_fail(b, "listen: NULL comm");
  if (bench_exchange(b, h, sizeof h, peer)) return -1;
  int64_t deadline = bench_now_ns() + b->cfg->timeout_ms * 1000000LL;
  while (!x->sc || !x->rc) {
    if (!x->sc && (r = t->connect(0, peer, &x->sc)) != ncclSuccess) return nfail(b, "connect", r);
    if (!x->rc && (r = t->accept(lc, &x->rc)) != ncclSuccess) return nfail(b, "accept", r);
    if (bench_aborted(b)) return -1;
    if (bench_now_ns() > deadline) return bench_fail(b, "connect/accept: no comms after --timeout-ms");
    if (!x->sc || !x->rc) sched_yield();
  }
  if ((r = t->closeListen(lc)) != ncclSuccess) return nfail(b, "closeListen", r);
  return 0;
}

static int setup(bench_t* b, nb_t* x) {
  if (open_lib(b, x) || connect_both(b, x)) return -1;
  const ncclNet_v6_t* t = x->t;
  if (bench_alloc(b)) return -1;
  ncclResult_t r;
  if ((r = t->regMr(x->sc, b->sbuf, b->cap, NCCL_PTR_HOST, &x->smh)) != ncclSuccess) return nfail(b, "regMr(send)", r);
  if ((r = t->regMr(x->rc, b->rbuf, b->cap, NCCL_PTR_HOST, &x->rmh)) != ncclSuccess) return nfail(b, "regMr(recv)", r);
  card_t me = {(uint64_t)(uintptr_t)b->sbuf, (uint64_t)(uintptr_t)b->rbuf, 0, 0}, peer;
  if (x->props.rma_supported) {
    if ((r = t->getMrKey(x->smh, &me.skey)) != ncclSuccess) return nfail(b, "getMrKey(send)", r);
    if ((r = t->getMrKey(x->rmh, &me.rkey)) != ncclSuccess) return nfail(b, "getMrKey(recv)", r);
  }
  if (bench_exchange(b, &me, sizeof me, &peer)) return -1;
  x->peer_saddr = peer.saddr, x->peer_raddr = peer.raddr, x->peer_skey = peer.skey, x->peer_rkey = peer.rkey;
  return 0;
}

static void teardown(nb_t* x) {
  if (x->t) {
    if (x->smh) x->t->deregMr(x->sc, x->smh);
    if (x->rmh) x->t->deregMr(x->rc, x->rmh);
    if (x->sc) x->t->closeSend(x->sc);
    if (x->rc) x->t->closeRecv(x->rc);
    if (x->inited) x->t->fini();
  }
}

static int rank_main(bench_t* b) {
  nb_t* x = calloc(1, sizeof *x);
  if (!x) return bench_fail(b, "out of memory");
  b->ctx = x;
  b->ops = &NB_OPS;
  int rc = setup(b, x);
  enum bench_op ops[4];
  size_t limit[4];
  int n = 0;
  for (int k = 0; !rc && k < g_nops; k++) {
    int rma = g_ops[k] != BOP_SEND;
    if (rma && !x->props.rma_supported) continue;
    if (g_ops[k] == BOP_INLINE && x->props.max_write_inline_size == 0) continue;
    limit[n] = g_ops[k] == BOP_INLINE ? x->props.max_write_inline_size : (size_t)-1;
    ops[n++] = g_ops[k];
  }
  if (!rc && b->rank == 0 && n < g_nops) {
    printf("# rma_supported %d, max_write_inline_size %zu: %d of the %d ops asked for are left out\n",
           x->props.rma_supported, x->props.max_write_inline_size, g_nops - n, g_nops);
    fflush(stdout);
  }
  rc = rc || bench_run(b, ops, limit, n);
  teardown(x);
  free(x);
  return rc ? -1 : 0;
}

int main(int argc, char** argv) {
  bench_cfg_t cfg;
  int rc = bench_parse(argc, argv, &cfg, "neuron_bench", USAGE, extra_opt);
  if (rc) return rc == 1 ? 0 : rc;
  return bench_fork(&cfg, "neuron_bench", rank_main);
}
