/*
 * neuron_mock.c: a minimal Neuron net plugin (ncclNetPlugin_v4/_v5/_v6 of neuron_net.h) used only
 * to self-test neuron_harness (make neuron-mock; neuron_selftest.sh). It is not fabricoll: data
 * moves over abstract-namespace Unix stream sockets, one per comm, progressed inside the calls;
 * RMA (MOCK_RMA=1 only) uses process_vm_writev/readv. It follows the team
 * contract (neuron31.md) so that the harness passes against it; MOCK_BUG=<name> injects one bug
 * that the named scenario must catch:
 *   corrupt  flip one received byte in messages >= 4096 B       (xfer6)
 *   overrun  write one byte past each received message           (xfer5)
 *   nulls    irecv returns a NULL request once 32 are in flight   (inflight)
 *   cudaok   regMr accepts type CUDA                              (badinput)
 *   loudclose  a close after fini logs a WARN line                (lifecycle)
 *   leakfd   never closes a connection's socket                   (cycles)
 *   leakmem  keeps a 16 KiB shadow of every registration, never freed  (ringcycles)
 *   hang     ignores EOF and errors from a dead peer              (kill)
 *   rmaoff   RMA one byte off the given address (with MOCK_RMA=1)  (rma)
 *   quieterr return errors without logging a WARN line              (badinput)
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "neuron_net.h"

#define MAGIC 0x6e6d6f636b763031ULL
#define MAXQ 256

enum kind { K_LISTEN = 1, K_SEND, K_RECV, K_MR, K_REQ };

typedef struct obj obj_t;
struct obj {
  uint64_t magic;
  int kind;
  int fd;
  obj_t* comm; /* K_REQ: its comm */
  /* K_REQ */
  int is_send, done, err, got;
  unsigned char* buf;
  size_t size, off;
  /* comm queues (K_SEND: sends to write; K_RECV: receives to fill) */
  obj_t* q[MAXQ];
  int qh, qn;
  unsigned char hdr[8];
  size_t hoff;      /* K_RECV: header bytes of the incoming message read so far */
  int dead;         /* the peer is gone */
};

static int rma_on(void);
static ncclDebugLogger_t g_log;
static int g_up;
static obj_t** g_objs; /* every live object, for pointer validation and fini */
static size_t g_nobj, g_cap;
static void** g_retired; /* closed by fini: closing them again is quiet */
static size_t g_nret, g_retcap;
static unsigned g_counter;

static int bug(const char* name) {
  const char* b = getenv("MOCK_BUG");
  return b && strcmp(b, name) == 0;
}

#define LOG(level, ...) \
  do {                  \
    if (g_log) g_log(level, NCCL_NET, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

static obj_t* new_obj(int kind) {
  if (g_nobj == g_cap) {
    size_t cap = g_cap ? 2 * g_cap : 64;
    obj_t** n = realloc(g_objs, cap * sizeof *n);
    if (!n) return NULL;
    g_objs = n, g_cap = cap;
  }
  obj_t* o = calloc(1, sizeof *o);
  if (!o) return NULL;
  o->magic = MAGIC, o->kind = kind, o->fd = -1;
  g_objs[g_nobj++] = o;
  return o;
}

static obj_t* find(void* p, int kind) {
  for (size_t i = 0; i < g_nobj; i++)
    if (g_objs[i] == p && (kind == 0 || g_objs[i]->kind == kind)) return g_objs[i];
  return NULL;
}

static void free_obj(obj_t* o) {
  for (size_t i = 0; i < g_nobj; i++)
    if (g_objs[i] == o) {
      g_objs[i] = g_objs[--g_nobj];
      break;
    }
  if (o->fd >= 0 && !bug("leakfd")) close(o->fd);
  free(o);
}

static int retired(void* p) {
  for (size_t i = 0; i < g_nret; i++)
    if (g_retired[i] == p) {
      g_retired[i] = g_retired[--g_nret];
      return 1;
    }
  return 0;
}

/* Every error is logged at WARN (the contract); the mock names only the line. */
static ncclResult_t err_at(ncclResult_t code, int line) {
  if (!bug("quieterr")) LOG(NCCL_LOG_WARN, "mock: error %d at line %d", (int)code, line);
  return code;
}
#define ERR(code) err_at((code), __LINE__)

static ncclResult_t bad(const char* what) {
  if (!bug("quieterr")) LOG(NCCL_LOG_WARN, "mock: invalid argument '%s'", what);
  return ncclInvalidArgument;
}

#define UP()                                               \
  do {                                                     \
    if (!g_up) return ERR(ncclInvalidUsage);               \
  } while (0)

/* --------------------------------------------------------------------------------- lifecycle */

static ncclResult_t m_init(ncclDebugLogger_t l) {
  g_log = l;
  if (g_up) return ERR(ncclSystemError);
  g_up = 1;
  return ncclSuccess;
}

static ncclResult_t m_fini(void) {
  if (!g_up) return ERR(ncclSystemError);
  while (g_nobj) {
    obj_t* o = g_objs[g_nobj - 1];
    if (g_nret == g_retcap) {
      size_t cap = g_retcap ? 2 * g_retcap : 64;
      void** n = realloc(g_retired, cap * sizeof *n);
      if (!n) return ERR(ncclSystemError);
      g_retired = n, g_retcap = cap;
    }
    g_retired[g_nret++] = o;
    free_obj(o);
  }
  g_up = 0;
  return ncclSuccess;
}

static ncclResult_t m_devices(int* n) {
  if (!n) return bad("ndev");
  UP();
  *n = 1;
  return ncclSuccess;
}

static void fill(ncclNetProperties_v6_t* p) {
  memset(p, 0, sizeof *p);
  p->name = "mock";
  p->ptrSupport = NCCL_PTR_HOST;
  p->speed = 10000;
  p->port = 1;
  p->latency = 10.0f;
  p->maxComms = 65536;
  p->maxRecvs = 1;
  if (rma_on()) p->rma_supported = 1, p->max_write_inline_size = 64, p->max_mr_key_size = 8;
}

static ncclResult_t m_props6(int dev, ncclNetProperties_v6_t* p) {
  UP();
  if (dev != 0) return bad("dev");
  if (!p) return bad("props");
  fill(p);
  return ncclSuccess;
}

static ncclResult_t m_props4(int dev, ncclNetProperties_v4_t* p) {
  UP();
  if (dev != 0) return bad("dev");
  if (!p) return bad("props");
  ncclNetProperties_v6_t q;
  fill(&q);
  p->name = q.name, p->pciPath = NULL, p->guid = 0, p->ptrSupport = q.ptrSupport;
  p->speed = q.speed, p->port = q.port, p->maxComms = q.maxComms;
  return ncclSuccess;
}

/* ------------------------------------------------------------------------------- connections */

typedef struct {
  uint64_t magic;
  char name[40];
  uint32_t polls; /* v5/v6: connect returns NULL on the first call, to exercise the polling */
} handle_t;
_Static_assert(sizeof(handle_t) <= NCCL_NET_HANDLE_MAXSIZE_V4, "mock handle fits v4");

static void sock_name(struct sockaddr_un* a, socklen_t* len, const char* name) {
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  size_t n = strlen(name);
  memcpy(a->sun_path + 1, name, n); /* abstract namespace */
  *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static ncclResult_t m_listen(int dev, void* handle, void** lc) {
  if (!handle) return bad("handle");
  if (!lc) return bad("listenComm");
  UP();
  if (dev != 0) return bad("dev");
  obj_t* o = new_obj(K_LISTEN);
  if (!o) return ERR(ncclSystemError);
  handle_t h;
  memset(&h, 0, sizeof h);
  h.magic = MAGIC;
  snprintf(h.name, sizeof h.name, "nmock-%d-%u", (int)getpid(), g_counter++);
  struct sockaddr_un a;
  socklen_t len;
  sock_name(&a, &len, h.name);
  o->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (o->fd < 0 || bind(o->fd, (struct sockaddr*)&a, len) != 0 || listen(o->fd, 512) != 0) {
    free_obj(o);
    return ERR(ncclSystemError);
  }
  memcpy(handle, &h, sizeof h);
  *lc = o;
  return ncclSuccess;
}

static ncclResult_t do_connect(void* handle, void** sc, int poll) {
  if (!handle) return bad("handle");
  if (!sc) return bad("sendComm");
  UP();
  *sc = NULL;
  handle_t h;
  memcpy(&h, handle, sizeof h);
  if (h.magic != MAGIC || memchr(h.name, 0, sizeof h.name) == NULL) return bad("handle");
  if (poll && h.polls++ == 0) {
    memcpy(handle, &h, sizeof h);
    return ncclSuccess;
  }
  obj_t* o = new_obj(K_SEND);
  if (!o) return ERR(ncclSystemError);
  struct sockaddr_un a;
  socklen_t len;
  sock_name(&a, &len, h.name);
  o->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (o->fd < 0 || connect(o->fd, (struct sockaddr*)&a, len) != 0) {
    free_obj(o);
    LOG(NCCL_LOG_WARN, "mock: connect to %s failed: %s", h.name, strerror(errno));
    return ERR(ncclRemoteError);
  }
  *sc = o;
  return ncclSuccess;
}

static ncclResult_t m_connect(int dev, void* handle, void** sc) {
  if (dev != 0) return bad("dev");
  return do_connect(handle, sc, 1);
}

static ncclResult_t m_connect4(int dev, void* handle, void** sc) {
  if (dev != 0) return bad("dev");
  return do_connect(handle, sc, 0);
}

static ncclResult_t do_accept(void* lc, void** rc, int block) {
  if (!rc) return bad("recvComm");
  UP();
  obj_t* l = find(lc, K_LISTEN);
  if (!l) return bad("listenComm");
  *rc = NULL;
  const char* t = getenv("FABRICOLL_TIMEOUT_MS");
  int tries = block ? (t ? atoi(t) : 20000) * 10 : 1; /* 100 us each */
  for (int i = 0; i < tries; i++) {
    int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0) {
      obj_t* o = new_obj(K_RECV);
      if (!o) return ERR(ncclSystemError);
      o->fd = fd;
      *rc = o;
      return ncclSuccess;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) return ERR(ncclSystemError);
    if (block) usleep(100);
  }
  return block ? ERR(ncclRemoteError) : ncclSuccess;
}

static ncclResult_t m_accept(void* lc, void** rc) { return do_accept(lc, rc, 0); }
static ncclResult_t m_accept4(void* lc, void** rc) { return do_accept(lc, rc, 1); }

/* ------------------------------------------------------------------------------ registration */

static ncclResult_t m_regmr(void* comm, void* data, size_t size, int type, void** mh) {
  if (!mh) return bad("mhandle");
  UP();
  if (!find(comm, K_SEND) && !find(comm, K_RECV)) return bad("comm");
  if (type == NCCL_PTR_NEURON) return ERR(ncclInvalidUsage);
  if (type != NCCL_PTR_HOST && !(type == NCCL_PTR_CUDA && bug("cudaok"))) return bad("type");
  (void)data, (void)size;
  if (bug("leakmem")) {
    char* shadow = malloc(16384); /* leaked on purpose, touched so that it counts in RSS */
    if (shadow) memset(shadow, 1, 16384);
  }
  obj_t* o = new_obj(K_MR);
  if (!o) return ERR(ncclSystemError);
  *mh = o;
  return ncclSuccess;
}

static ncclResult_t m_regmr_dmabuf(void* comm, void* data, size_t size, int type, uint64_t off, int fd, void** mh) {
  (void)off;
  if (fd != -1) return ERR(ncclInvalidUsage);
  return m_regmr(comm, data, size, type, mh);
}

static ncclResult_t m_deregmr(void* comm, void* mh) {
  if (retired(mh)) return ncclSuccess;
  UP();
  if (!find(comm, K_SEND) && !find(comm, K_RECV)) return bad("comm");
  obj_t* m = find(mh, K_MR);
  if (!m) return bad("mhandle");
  free_obj(m);
  return ncclSuccess;
}

/* ---------------------------------------------------------------------------------- progress */

static void progress(obj_t* c) {
  while (c->qn > 0 && !c->dead) {
    obj_t* r = c->q[c->qh];
    if (r->is_send) {
      uint32_t hdr[2] = {(uint32_t)r->size, 0};
      size_t total = 8 + r->size;
      while (r->off < total) {
        const void* p = r->off < 8 ? (const unsigned char*)hdr + r->off : r->buf + (r->off - 8);
        size_t n = r->off < 8 ? 8 - r->off : total - r->off;
        ssize_t w = send(c->fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (w <= 0) {
          if (!bug("hang")) c->dead = 1, r->err = 1;
          return;
        }
        r->off += (size_t)w;
      }
    } else {
      while (c->hoff < 8) {
        ssize_t n = recv(c->fd, c->hdr + c->hoff, 8 - c->hoff, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n <= 0) {
          if (!bug("hang")) c->dead = 1, r->err = 1;
          return;
        }
        c->hoff += (size_t)n;
      }
      uint32_t sz;
      memcpy(&sz, c->hdr, 4);
      if (sz > r->size) {
        c->dead = 1, r->err = 1;
        return;
      }
      while (r->off < sz) {
        ssize_t n = recv(c->fd, r->buf + r->off, sz - r->off, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n <= 0) {
          if (!bug("hang")) c->dead = 1, r->err = 1;
          return;
        }
        r->off += (size_t)n;
      }
      r->got = (int)sz;
      c->hoff = 0;
      if (bug("corrupt") && sz >= 4096) r->buf[sz / 2] ^= 1;
      if (bug("overrun") && sz < r->size) r->buf[sz] = 0;
    }
    r->done = 1;
    c->qh = (c->qh + 1) % MAXQ;
    c->qn--;
  }
}

static ncclResult_t post(obj_t* c, int is_send, void* data, int size, void** req) {
  *req = NULL;
  if (c->qn == MAXQ || (bug("nulls") && !is_send && c->qn >= 32)) return ncclSuccess;
  if (c->dead) return ERR(ncclRemoteError);
  obj_t* r = new_obj(K_REQ);
  if (!r) return ERR(ncclSystemError);
  r->comm = c, r->is_send = is_send, r->buf = data, r->size = (size_t)size;
  c->q[(c->qh + c->qn) % MAXQ] = r;
  c->qn++;
  progress(c);
  *req = r;
  return ncclSuccess;
}

static ncclResult_t m_isend(void* sc, void* data, int size, int tag, void* mh, void** req) {
  (void)tag;
  if (!req) return bad("request");
  UP();
  obj_t* c = find(sc, K_SEND);
  if (!c) return bad("sendComm");
  if (size < 0) return bad("size");
  if (!find(mh, K_MR)) return bad("mhandle");
  return post(c, 1, data, size, req);
}

static ncclResult_t m_isend4(void* sc, void* data, int size, void* mh, void** req) {
  return m_isend(sc, data, size, 0, mh, req);
}

static ncclResult_t m_irecv(void* rc, int n, void** data, int* sizes, int* tags, void** mhs, void** req) {
  (void)tags;
  if (!req) return bad("request");
  UP();
  obj_t* c = find(rc, K_RECV);
  if (!c) return bad("recvComm");
  if (n < 1 || n > 8) return bad("n");
  if (n != 1 || !data || !sizes || !mhs || sizes[0] < 0) return bad("data/sizes");
  return post(c, 0, data[0], sizes[0], req);
}

static ncclResult_t m_irecv4(void* rc, void* data, int size, void* mh, void** req) {
  return m_irecv(rc, 1, &data, &size, NULL, &mh, req);
}

static ncclResult_t m_iflush(void* rc, int n, void** data, int* sizes, void** mhs, void** req) {
  (void)data, (void)sizes, (void)mhs;
  if (!req) return bad("request");
  UP();
  if (!find(rc, K_RECV)) return bad("recvComm");
  if (n < 1 || n > 8) return bad("n");
  *req = NULL; /* host memory: nothing to flush */
  return ncclSuccess;
}

static ncclResult_t m_iflush4(void* rc, void* data, int size, void* mh, void** req) {
  return m_iflush(rc, 1, &data, &size, &mh, req);
}

static ncclResult_t m_test(void* req, int* done, int* sizes) {
  if (!done) return bad("done");
  UP();
  obj_t* r = find(req, K_REQ);
  if (!r) return bad("request");
  obj_t* c = find(r->comm, 0);
  if (c) progress(c);
  if (r->err) return ERR(ncclRemoteError);
  *done = r->done;
  if (r->done) {
    if (sizes) sizes[0] = r->is_send ? (int)r->size : r->got;
    free_obj(r);
  }
  return ncclSuccess;
}

static ncclResult_t close_kind(void* comm, int kind) {
  if (retired(comm)) {
    if (bug("loudclose")) LOG(NCCL_LOG_WARN, "mock: close after fini");
    return ncclSuccess;
  }
  UP();
  obj_t* c = find(comm, kind);
  if (!c) return bad("comm");
  for (size_t i = 0; i < g_nobj;) /* its requests go with it */
    if (g_objs[i]->kind == K_REQ && g_objs[i]->comm == c) free_obj(g_objs[i]);
    else i++;
  free_obj(c);
  return ncclSuccess;
}

static ncclResult_t m_close_send(void* c) { return close_kind(c, K_SEND); }
static ncclResult_t m_close_recv(void* c) { return close_kind(c, K_RECV); }
static ncclResult_t m_close_listen(void* c) { return close_kind(c, K_LISTEN); }

/* ----------------------------------------------------------------------------------------- RMA */
/* MOCK_RMA=1: rma_supported 1, done with process_vm_writev/readv into the process named by the
 * key (the registering process's pid); otherwise the four calls return SystemError. */

static int rma_on(void) {
  const char* e = getenv("MOCK_RMA");
  return e && strcmp(e, "1") == 0;
}

static ncclResult_t m_getmrkey(void* mh, uint64_t* key) {
  UP();
  if (!find(mh, K_MR)) return bad("mhandle");
  if (!key) return bad("mr_key");
  if (!rma_on()) return ERR(ncclSystemError);
  *key = (uint64_t)getpid();
  return ncclSuccess;
}

/* One RMA op, done at once: a request that test reports done with the size. */
static ncclResult_t rma_op(int write, void* local, size_t size, uint64_t addr, uint64_t key, void** req) {
  if (!req) return bad("request");
  if (bug("rmaoff")) addr += 1;
  struct iovec l = {local, size}, r = {(void*)(uintptr_t)addr, size};
  ssize_t n = write ? process_vm_writev((pid_t)key, &l, 1, &r, 1, 0) : process_vm_readv((pid_t)key, &l, 1, &r, 1, 0);
  if (n != (ssize_t)size) {
    LOG(NCCL_LOG_WARN, "mock: process_vm_%sv of %zu B: %s", write ? "write" : "read", size, strerror(errno));
    return ERR(ncclRemoteError);
  }
  obj_t* o = new_obj(K_REQ);
  if (!o) return ERR(ncclSystemError);
  o->is_send = 1, o->size = size, o->done = 1;
  *req = o;
  return ncclSuccess;
}

static ncclResult_t m_iwrite(void* sc, void* src, size_t size, void* mh, uint64_t dest, uint64_t key, void** req) {
  UP();
  if (!find(sc, K_SEND)) return bad("sComm");
  if (!rma_on()) return ERR(ncclSystemError);
  if (!find(mh, K_MR)) return bad("src_mhandle");
  return rma_op(1, src, size, dest, key, req);
}

static ncclResult_t m_iwrite_inline(void* sc, void* src, size_t size, uint64_t dest, uint64_t key, void** req) {
  UP();
  if (!find(sc, K_SEND)) return bad("sComm");
  if (!rma_on()) return ERR(ncclSystemError);
  if (size > 64) return bad("size");
  return rma_op(1, src, size, dest, key, req);
}

static ncclResult_t m_iread(void* rc, void* dst, size_t size, void* mh, uint64_t src, uint64_t key, void** req) {
  UP();
  if (!find(rc, K_RECV)) return bad("rComm");
  if (!rma_on()) return ERR(ncclSystemError);
  if (!find(mh, K_MR)) return bad("dest_mhandle");
  return rma_op(0, dst, size, src, key, req);
}

/* ------------------------------------------------------------------------------------ tables */

__attribute__((visibility("default"))) const ncclNet_v6_t ncclNetPlugin_v6 = {
    "fabricoll", m_init, m_fini, m_devices, m_props6, m_listen, m_connect, m_accept, m_regmr, m_regmr_dmabuf,
    m_deregmr, m_isend, m_irecv, m_iflush, m_test, m_close_send, m_close_recv, m_close_listen, m_getmrkey, m_iwrite,
    m_iwrite_inline, m_iread};

__attribute__((visibility("default"))) const ncclNet_v5_t ncclNetPlugin_v5 = {
    "fabricoll", m_init, m_devices, m_props6, m_listen, m_connect, m_accept, m_regmr, m_regmr_dmabuf, m_deregmr,
    m_isend, m_irecv, m_iflush, m_test, m_close_send, m_close_recv, m_close_listen, m_getmrkey, m_iwrite,
    m_iwrite_inline, m_iread};

__attribute__((visibility("default"))) const ncclNet_v4_t ncclNetPlugin_v4 = {
    "fabricoll", m_init, m_devices, m_props4, m_listen, m_connect4, m_accept4, m_regmr, m_deregmr,
    m_isend4, m_irecv4, m_iflush4, m_test, m_close_send, m_close_recv, m_close_listen};
