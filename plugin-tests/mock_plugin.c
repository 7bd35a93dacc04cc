/*
 * mock_plugin.c: a minimal reference net plugin used only to self-test net_harness/net_bench
 * (make mock; ./selftest.sh). It is not fabricoll: it moves data over abstract-namespace Unix
 * stream sockets (no network traffic at all), one socket per comm, progressed inside
 * isend/irecv/test. It follows the contract fabricoll promises (non-blocking setup, posted-order
 * tag matching, >= 32 requests per comm, pointer validation, errors on a dead peer) so the harness
 * should pass against it; MOCK_BUG=<name> injects one bug so that the matching scenario must fail:
 *   corrupt    flip one received byte in messages >= 4096 B          (xfer, pairs16, ...)
 *   overrun    write one byte past the end of each received message     (xfer)
 *   badsize    report size+1 in test() for received messages >= 100 B  (xfer, group)
 *   tagorder   ignore tags within a grouped receive (fill in arrival order)   (group)
 *   nulls      return a NULL request once 8 requests are in flight      (inflight32)
 *   hang       ignore EOF/EPIPE from a dead peer                        (kill)
 *   leakfd     never close the connection's socket                      (cycles)
 *   noverify   accept garbage comm pointers as long as they are not NULL (badinput: crash)
 *   hint       leave the 0x1 *request hint untouched when it would return NULL (badinput)
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "nccl_net.h"

#define MAGIC 0x6d6f636b6e657431ULL
#define MAXRECV 8
#define MAXREQ 64

static int bug(const char* name) {
  const char* b = getenv("MOCK_BUG");
  return b && strcmp(b, name) == 0;
}

enum kind { K_LISTEN = 1, K_SEND, K_RECV, K_MR, K_REQ };

typedef struct obj {
  enum kind kind;
  struct obj* next_live; /* registry */
} obj_t;

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static obj_t* live;

static void reg_add(obj_t* o, enum kind k) {
  o->kind = k;
  pthread_mutex_lock(&reg_lock);
  o->next_live = live;
  live = o;
  pthread_mutex_unlock(&reg_lock);
}

static void reg_del(obj_t* o) {
  pthread_mutex_lock(&reg_lock);
  for (obj_t** p = &live; *p; p = &(*p)->next_live)
    if (*p == o) {
      *p = o->next_live;
      break;
    }
  pthread_mutex_unlock(&reg_lock);
  o->kind = 0;
}

static int valid(const void* p, enum kind k) {
  if (!p) return 0;
  if (bug("noverify")) return ((const obj_t*)p)->kind == k; /* dereferences garbage */
  int ok = 0;
  pthread_mutex_lock(&reg_lock);
  for (obj_t* o = live; o; o = o->next_live)
    if (o == p) ok = o->kind == k;
  pthread_mutex_unlock(&reg_lock);
  return ok;
}

typedef struct {
  uint64_t magic;
  char name[100];
} handle_t;

typedef struct {
  obj_t o;
  int fd;
} listen_t;

struct comm;
typedef struct req {
  obj_t o;
  struct comm* comm;
  struct req* next;
  int is_send;
  int done;
  int error;
  /* send */
  const char* sdata;
  size_t ssize, sent; /* sent counts header bytes too */
  unsigned char hdr[16];
  /* recv */
  int n;
  void* data[MAXRECV];
  size_t cap[MAXRECV];
  int tag[MAXRECV];
  int filled[MAXRECV];
  size_t got[MAXRECV];
} req_t;

typedef struct comm {
  obj_t o;
  int fd;
  int dead;
  int inflight;
  req_t *head, *tail; /* FIFO of pending requests */
  /* recv state */
  unsigned char hbuf[16];
  size_t hgot;
  int have_hdr;
  req_t* cur;
  int curi;
  size_t remaining;
} comm_t;

typedef struct {
  obj_t o;
  void* comm;
  void* data;
  size_t size;
} mr_t;

static ncclDebugLogger_t logger;
#define LOG(...) \
  do { if (logger) logger(NCCL_LOG_INFO, NCCL_NET, __FILE__, __LINE__, __VA_ARGS__); } while (0)

static ncclResult_t m_init_common(ncclDebugLogger_t l) {
  logger = l;
  LOG("mock plugin init (pid %d)", (int)getpid());
  return ncclSuccess;
}

static ncclResult_t m_devices(int* n) {
  if (!n) return ncclInvalidArgument;
  *n = 1;
  return ncclSuccess;
}

static void fill_common(int dev, char** name, char** pci, uint64_t* guid, int* ptr, int* speed, int* port, float* lat,
                        int* maxComms, int* maxRecvs) {
  (void)dev;
  *name = "mock0";
  *pci = NULL;
  *guid = 0x1234;
  *ptr = NCCL_PTR_HOST;
  *speed = 10000;
  *port = 1;
  *lat = 0;
  *maxComms = 65536;
  *maxRecvs = MAXRECV;
}

#define PROPS_COMMON(p) fill_common(dev, &p->name, &p->pciPath, &p->guid, &p->ptrSupport, &p->speed, &p->port, \
                                    &p->latency, &p->maxComms, &p->maxRecvs)

static ncclResult_t props_v6(int dev, ncclNetProperties_v6_t* p) {
  if (dev != 0 || !p) return ncclInvalidArgument;
  memset(p, 0, sizeof *p);
  PROPS_COMMON(p);
  return ncclSuccess;
}
static ncclResult_t props_v7(int dev, ncclNetProperties_v7_t* p) {
  if (dev != 0 || !p) return ncclInvalidArgument;
  memset(p, 0, sizeof *p);
  PROPS_COMMON(p);
  return ncclSuccess;
}
static ncclResult_t props_v8(int dev, ncclNetProperties_v8_t* p) {
  if (dev != 0 || !p) return ncclInvalidArgument;
  memset(p, 0, sizeof *p);
  PROPS_COMMON(p);
  return ncclSuccess;
}
static ncclResult_t props_v9(int dev, ncclNetProperties_v9_t* p) {
  if (dev != 0 || !p) return ncclInvalidArgument;
  memset(p, 0, sizeof *p);
  PROPS_COMMON(p);
  p->vProps.ndevs = 1;
  p->maxP2pBytes = p->maxCollBytes = 1UL << 30;
  return ncclSuccess;
}
static ncclResult_t props_v11(int dev, ncclNetProperties_v11_t* p) {
  if (dev != 0 || !p) return ncclInvalidArgument;
  memset(p, 0, sizeof *p);
  PROPS_COMMON(p);
  p->vProps.ndevs = 1;
  p->maxP2pBytes = p->maxCollBytes = 1UL << 30;
  p->maxMultiRequestSize = 1;
  return ncclSuccess;
}
static ncclResult_t props_v12(int dev, ncclNetProperties_v12_t* p) {
  if (dev != 0 || !p) return ncclInvalidArgument;
  memset(p, 0, sizeof *p);
  PROPS_COMMON(p);
  p->vProps.ndevs = 1;
  p->maxP2pBytes = p->maxCollBytes = 1UL << 30;
  p->maxMultiRequestSize = 1;
  p->railId = p->planeId = -1;
  return ncclSuccess;
}

static ncclResult_t m_listen(int dev, void* handle, void** lc) {
  static int counter;
  if (dev != 0 || !handle || !lc) return ncclInvalidArgument;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return ncclSystemError;
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  handle_t h;
  memset(&h, 0, sizeof h);
  h.magic = MAGIC;
  snprintf(h.name, sizeof h.name, "fabmock-%d-%d-%lx", (int)getpid(), __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED),
           (unsigned long)(uintptr_t)&h ^ (unsigned long)random());
  memcpy(a.sun_path + 1, h.name, strlen(h.name));
  socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(h.name));
  if (bind(fd, (struct sockaddr*)&a, len) != 0 || listen(fd, 64) != 0) {
    close(fd);
    return ncclSystemError;
  }
  listen_t* l = calloc(1, sizeof *l);
  l->fd = fd;
  reg_add(&l->o, K_LISTEN);
  memcpy(handle, &h, sizeof h);
  *lc = l;
  return ncclSuccess;
}

static comm_t* new_comm(int fd, enum kind k) {
  comm_t* c = calloc(1, sizeof *c);
  c->fd = fd;
  reg_add(&c->o, k);
  return c;
}

static ncclResult_t m_connect(int dev, void* handle, void** sc) {
  if (dev != 0 || !handle || !sc) return ncclInvalidArgument;
  handle_t h;
  memcpy(&h, handle, sizeof h);
  if (h.magic != MAGIC || memchr(h.name, 0, sizeof h.name) == NULL) return ncclInvalidArgument;
  *sc = NULL;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return ncclSystemError;
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  memcpy(a.sun_path + 1, h.name, strlen(h.name));
  socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(h.name));
  if (connect(fd, (struct sockaddr*)&a, len) != 0) {
    int e = errno;
    close(fd);
    if (e == EAGAIN) return ncclSuccess; /* backlog full: try again later */
    return ncclRemoteError;
  }
  *sc = new_comm(fd, K_SEND);
  return ncclSuccess;
}

static ncclResult_t m_accept(void* lc, void** rc) {
  if (!valid(lc, K_LISTEN) || !rc) return ncclInvalidArgument;
  listen_t* l = lc;
  *rc = NULL;
  int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) return (errno == EAGAIN || errno == EWOULDBLOCK) ? ncclSuccess : ncclSystemError;
  *rc = new_comm(fd, K_RECV);
  return ncclSuccess;
}

static ncclResult_t m_regmr(void* comm, void* data, size_t size, int type, void** mh) {
  if ((!valid(comm, K_SEND) && !valid(comm, K_RECV)) || !mh || type != NCCL_PTR_HOST) return ncclInvalidArgument;
  if (size > (1ULL << 40)) return ncclInvalidArgument;
  mr_t* m = calloc(1, sizeof *m);
  m->comm = comm;
  m->data = data;
  m->size = size;
  reg_add(&m->o, K_MR);
  *mh = m;
  return ncclSuccess;
}
static ncclResult_t m_regmr_int(void* comm, void* data, int size, int type, void** mh) {
  if (size < 0) return ncclInvalidArgument;
  return m_regmr(comm, data, (size_t)size, type, mh);
}
/* A host buffer (or no fd) is regMr; the mock advertises no dma-bufs, so any other is refused. */
static ncclResult_t m_regmr_dmabuf(void* comm, void* data, size_t size, int type, uint64_t off, int fd, void** mh) {
  (void)off;
  if (type == NCCL_PTR_HOST || fd < 0) return m_regmr(comm, data, size, type, mh);
  return ncclInvalidUsage;
}
static ncclResult_t m_deregmr(void* comm, void* mh) {
  if ((!valid(comm, K_SEND) && !valid(comm, K_RECV)) || !valid(mh, K_MR)) return ncclInvalidArgument;
  reg_del(mh);
  free(mh);
  return ncclSuccess;
}

static void push(comm_t* c, req_t* r) {
  r->next = NULL;
  if (c->tail) c->tail->next = r;
  else c->head = r;
  c->tail = r;
  c->inflight++;
}

static void unlink_req(comm_t* c, req_t* r) {
  for (req_t** p = &c->head; *p; p = &(*p)->next)
    if (*p == r) {
      *p = r->next;
      break;
    }
  c->tail = NULL;
  for (req_t* q = c->head; q; q = q->next) c->tail = q;
}

static void fail_all(comm_t* c) {
  if (bug("hang")) return;
  c->dead = 1;
  for (req_t* r = c->head; r; r = r->next)
    if (!r->done) r->error = 1;
}

static void progress_send(comm_t* c) {
  for (req_t* r = c->head; r; r = r->next) {
    if (r->done) continue;
    size_t total = sizeof r->hdr + r->ssize;
    while (r->sent < total) {
      const void* p;
      size_t len;
      if (r->sent < sizeof r->hdr) p = r->hdr + r->sent, len = sizeof r->hdr - r->sent;
      else p = r->sdata + (r->sent - sizeof r->hdr), len = total - r->sent;
      ssize_t w = send(c->fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        fail_all(c);
        return;
      }
      r->sent += (size_t)w;
    }
    r->done = 1;
  }
}

static void progress_recv(comm_t* c) {
  for (;;) {
    if (!c->have_hdr) {
      ssize_t g = recv(c->fd, c->hbuf + c->hgot, sizeof c->hbuf - c->hgot, MSG_DONTWAIT);
      if (g == 0) {
        fail_all(c);
        return;
      }
      if (g < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) fail_all(c);
        return;
      }
      c->hgot += (size_t)g;
      if (c->hgot < sizeof c->hbuf) continue;
      c->have_hdr = 1;
      c->cur = NULL;
    }
    int tag;
    uint64_t size;
    memcpy(&tag, c->hbuf, 4);
    memcpy(&size, c->hbuf + 8, 8);
    if (!c->cur) { /* match: oldest receive with an unfilled buffer of this tag */
      for (req_t* r = c->head; r && !c->cur; r = r->next) {
        if (r->done) continue;
        for (int i = 0; i < r->n; i++)
          if (!r->filled[i] && (r->tag[i] == tag || bug("tagorder"))) {
            c->cur = r;
            c->curi = i;
            break;
          }
      }
      if (!c->cur) return; /* no receive posted yet: leave it in the socket */
      if (size > c->cur->cap[c->curi]) {
        c->cur->error = 1;
        c->dead = 1;
        return;
      }
      c->remaining = size;
    }
    req_t* r = c->cur;
    int i = c->curi;
    while (c->remaining) {
      char* dst = (char*)r->data[i] + (size - c->remaining);
      ssize_t g = recv(c->fd, dst, c->remaining, MSG_DONTWAIT);
      if (g == 0) {
        fail_all(c);
        return;
      }
      if (g < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) fail_all(c);
        return;
      }
      c->remaining -= (size_t)g;
    }
    if (bug("corrupt") && size >= 4096) ((unsigned char*)r->data[i])[size / 2] ^= 0x40;
    if (bug("overrun")) ((unsigned char*)r->data[i])[size] = 0;
    r->filled[i] = 1;
    r->got[i] = size;
    int all = 1;
    for (int k = 0; k < r->n; k++) all &= r->filled[k];
    if (all) r->done = 1;
    c->have_hdr = 0;
    c->hgot = 0;
    c->cur = NULL;
  }
}

static void progress(comm_t* c) {
  if (c->dead) return;
  if (c->o.kind == K_SEND) progress_send(c);
  else progress_recv(c);
}

static ncclResult_t m_isend(void* sc, void* data, size_t size, int tag, void* mh, void** request) {
  if (!valid(sc, K_SEND) || !request || size > (1ULL << 40) || !valid(mh, K_MR)) return ncclInvalidArgument;
  comm_t* c = sc;
  if (c->dead) return ncclRemoteError;
  *request = NULL;
  if (c->inflight >= MAXREQ || (bug("nulls") && c->inflight >= 8)) {
    progress(c);
    return ncclSuccess;
  }
  req_t* r = calloc(1, sizeof *r);
  r->comm = c;
  r->is_send = 1;
  r->sdata = data;
  r->ssize = size;
  uint64_t s64 = size;
  memcpy(r->hdr, &tag, 4);
  memcpy(r->hdr + 8, &s64, 8);
  reg_add(&r->o, K_REQ);
  push(c, r);
  progress(c);
  *request = r;
  return ncclSuccess;
}

static ncclResult_t m_irecv(void* rc, int n, void** data, size_t* sizes, int* tags, void** mhs, void** request) {
  if (!valid(rc, K_RECV) || !request || n < 1 || n > MAXRECV || !data || !sizes || !tags || !mhs)
    return ncclInvalidArgument;
  for (int i = 0; i < n; i++)
    if (sizes[i] > (1ULL << 40) || !valid(mhs[i], K_MR)) return ncclInvalidArgument;
  comm_t* c = rc;
  if (c->dead) return ncclRemoteError;
  if (c->inflight >= MAXREQ || (bug("nulls") && c->inflight >= 8)) {
    if (!bug("hint")) *request = NULL;
    progress(c);
    return ncclSuccess;
  }
  if (bug("hint") && *request == (void*)0x1) return ncclSuccess; /* "completed early", hint left in place */
  req_t* r = calloc(1, sizeof *r);
  r->comm = c;
  r->n = n;
  for (int i = 0; i < n; i++) {
    r->data[i] = data[i];
    r->cap[i] = sizes[i];
    r->tag[i] = tags[i];
  }
  reg_add(&r->o, K_REQ);
  push(c, r);
  progress(c);
  *request = r;
  return ncclSuccess;
}

static ncclResult_t m_isend_int(void* sc, void* data, int size, int tag, void* mh, void** request) {
  if (size < 0) return ncclInvalidArgument;
  return m_isend(sc, data, (size_t)size, tag, mh, request);
}
static ncclResult_t m_isend_v10(void* sc, void* data, size_t size, int tag, void* mh, void* ph, void** request) {
  (void)ph;
  return m_isend(sc, data, size, tag, mh, request);
}
static ncclResult_t m_irecv_int(void* rc, int n, void** data, int* sizes, int* tags, void** mhs, void** request) {
  if (n < 1 || n > MAXRECV || !sizes) return ncclInvalidArgument;
  size_t s[MAXRECV];
  for (int i = 0; i < n; i++) {
    if (sizes[i] < 0) return ncclInvalidArgument;
    s[i] = (size_t)sizes[i];
  }
  return m_irecv(rc, n, data, s, tags, mhs, request);
}
static ncclResult_t m_irecv_v10(void* rc, int n, void** data, size_t* sizes, int* tags, void** mhs, void** ph,
                                void** request) {
  (void)ph;
  return m_irecv(rc, n, data, sizes, tags, mhs, request);
}

static ncclResult_t m_iflush(void* rc, int n, void** data, int* sizes, void** mhs, void** request) {
  if (!valid(rc, K_RECV) || !request || n < 1 || n > MAXRECV || !data || !sizes || !mhs) return ncclInvalidArgument;
  for (int i = 0; i < n; i++)
    if (sizes[i] < 0) return ncclInvalidArgument;
  *request = NULL;
  return ncclSuccess;
}

static ncclResult_t m_test(void* request, int* done, int* sizes) {
  if (!valid(request, K_REQ) || !done) return ncclInvalidArgument;
  req_t* r = request;
  comm_t* c = r->comm;
  progress(c);
  *done = 0;
  if (r->error) {
    return ncclRemoteError; /* the request stays registered; NCCL aborts anyway */
  }
  if (!r->done) return ncclSuccess;
  *done = 1;
  if (sizes) {
    if (r->is_send) sizes[0] = (int)r->ssize;
    else
      for (int i = 0; i < r->n; i++) sizes[i] = (int)r->got[i] + (bug("badsize") && r->got[i] >= 100 ? 1 : 0);
  }
  unlink_req(c, r);
  c->inflight--;
  reg_del(&r->o);
  free(r);
  return ncclSuccess;
}

static ncclResult_t close_comm(void* p, enum kind k) {
  if (!valid(p, k)) return ncclInvalidArgument;
  comm_t* c = p;
  reg_del(&c->o);
  for (req_t* r = c->head; r;) {
    req_t* n = r->next;
    reg_del(&r->o);
    free(r);
    r = n;
  }
  if (!bug("leakfd")) close(c->fd);
  free(c);
  return ncclSuccess;
}
static ncclResult_t m_close_send(void* sc) { return close_comm(sc, K_SEND); }
static ncclResult_t m_close_recv(void* rc) { return close_comm(rc, K_RECV); }
static ncclResult_t m_close_listen(void* lc) {
  if (!valid(lc, K_LISTEN)) return ncclInvalidArgument;
  listen_t* l = lc;
  reg_del(&l->o);
  close(l->fd);
  free(l);
  return ncclSuccess;
}

/* ---- per-version shims ---- */
static ncclResult_t init_v6(ncclDebugLogger_t l) { return m_init_common(l); }
static ncclResult_t init_v10(ncclDebugLogger_t l, ncclProfilerCallback_t p) {
  (void)p;
  return m_init_common(l);
}
static int ctx_token;
static ncclResult_t init_v11(void** ctx, uint64_t id, ncclNetCommConfig_v11_t* cfg, ncclDebugLogger_t l,
                             ncclProfilerCallback_t p) {
  (void)id, (void)cfg, (void)p;
  if (!ctx) return ncclInvalidArgument;
  *ctx = &ctx_token;
  return m_init_common(l);
}
static ncclResult_t finalize_v11(void* ctx) { return ctx == &ctx_token ? ncclSuccess : ncclInvalidArgument; }
static ncclResult_t listen_v11(void* ctx, int dev, void* h, void** lc) {
  (void)ctx;
  return m_listen(dev, h, lc);
}
static ncclResult_t connect_v7(int dev, void* h, void** sc, ncclNetDeviceHandle_v7_t** dc) {
  (void)dc;
  return m_connect(dev, h, sc);
}
static ncclResult_t connect_v10(int dev, ncclNetCommConfig_v10_t* cfg, void* h, void** sc,
                                ncclNetDeviceHandle_v10_t** dc) {
  (void)cfg, (void)dc;
  return m_connect(dev, h, sc);
}
static ncclResult_t connect_v11(void* ctx, int dev, void* h, void** sc, ncclNetDeviceHandle_v11_t** dc) {
  (void)ctx, (void)dc;
  return m_connect(dev, h, sc);
}
static ncclResult_t accept_v7(void* lc, void** rc, ncclNetDeviceHandle_v7_t** dc) {
  (void)dc;
  return m_accept(lc, rc);
}
static ncclResult_t setattr_v11(void* ctx, ncclNetAttr_v11_t* a) {
  (void)ctx, (void)a;
  return ncclSuccess;
}

#define TAIL6 m_regmr_dmabuf, m_deregmr
const ncclNet_v6_t ncclNetPlugin_v6 = {"fabricoll", init_v6, m_devices, props_v6, m_listen, m_connect, m_accept,
                                       m_regmr_int, TAIL6, m_isend_int, m_irecv_int, m_iflush, m_test, m_close_send,
                                       m_close_recv, m_close_listen};
const ncclNet_v7_t ncclNetPlugin_v7 = {"fabricoll", init_v6, m_devices, props_v7, m_listen, connect_v7, accept_v7,
                                       m_regmr_int, TAIL6, m_isend_int, m_irecv_int, m_iflush, m_test, m_close_send,
                                       m_close_recv, m_close_listen, NULL, NULL};
const ncclNet_v8_t ncclNetPlugin_v8 = {"fabricoll", init_v6, m_devices, props_v8, m_listen, connect_v7, accept_v7,
                                       m_regmr, TAIL6, m_isend_int, m_irecv_int, m_iflush, m_test, m_close_send,
                                       m_close_recv, m_close_listen, NULL, NULL};
const ncclNet_v9_t ncclNetPlugin_v9 = {"fabricoll", init_v6, m_devices, props_v9, m_listen, connect_v7, accept_v7,
                                       m_regmr, TAIL6, m_isend, m_irecv, m_iflush, m_test, m_close_send,
                                       m_close_recv, m_close_listen, NULL, NULL, NULL};
const ncclNet_v10_t ncclNetPlugin_v10 = {"fabricoll", init_v10, m_devices, props_v9,
                                         m_listen, connect_v10, accept_v7, m_regmr, TAIL6, m_isend_v10, m_irecv_v10,
                                         m_iflush, m_test, m_close_send, m_close_recv, m_close_listen, NULL, NULL, NULL};
const ncclNet_v11_t ncclNetPlugin_v11 = {"fabricoll", init_v11, m_devices, props_v11, listen_v11, connect_v11,
                                         accept_v7, m_regmr, TAIL6, m_isend_v10, m_irecv_v10, m_iflush, m_test,
                                         m_close_send, m_close_recv, m_close_listen, NULL, NULL, NULL, finalize_v11,
                                         setattr_v11};
const ncclNet_v12_t ncclNetPlugin_v12 = {"fabricoll", init_v11, m_devices, props_v12, listen_v11, connect_v11,
                                         accept_v7, m_regmr, TAIL6, m_isend_v10, m_irecv_v10, m_iflush, m_test,
                                         m_close_send, m_close_recv, m_close_listen, NULL, NULL, NULL, finalize_v11,
                                         setattr_v11};
