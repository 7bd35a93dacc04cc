/*
 * neuron_calls.c: calling the Neuron tables the way libnccom does (see neuron_harness.h): one
 * wrapper per member that picks the loaded version's layout, then setup, connection and
 * transfer helpers built on them, each polling with a deadline.
 */
#include "neuron_harness.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ table wrappers */

static const char* sym_of(int v) {
  return v == 4 ? "ncclNetPlugin_v4" : v == 5 ? "ncclNetPlugin_v5" : v == 6 ? "ncclNetPlugin_v6" : "?";
}

int nn_open(nn_t* n, const char* path, int version, char* err, size_t errlen) {
  memset(n, 0, sizeof *n);
  if (version < 4 || version > 6) {
    snprintf(err, errlen, "unsupported table version %d", version);
    return -1;
  }
  dlerror();
  void* dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    const char* e = dlerror();
    snprintf(err, errlen, "dlopen(%s) failed: %s", path, e ? e : "?");
    return -1;
  }
  void* sym = dlsym(dl, sym_of(version));
  if (!sym) {
    const char* e = dlerror();
    snprintf(err, errlen, "dlsym(%s) failed: %s", sym_of(version), e ? e : "symbol is NULL");
    dlclose(dl);
    return -1;
  }
  n->dl = dl;
  n->v = version;
  if (version == 4) n->t4 = sym;
  if (version == 5) n->t5 = sym;
  if (version == 6) n->t6 = sym;
  return 0;
}

void nn_close_dl(nn_t* n) {
  if (n->dl) dlclose(n->dl);
  n->dl = NULL;
}

/* Members with the same signature in all three versions. */
#define CALL_ALL(n, m, ...) \
  ((n)->v == 6 ? (n)->t6->m(__VA_ARGS__) : (n)->v == 5 ? (n)->t5->m(__VA_ARGS__) : (n)->t4->m(__VA_ARGS__))
/* Members of v5 and v6 only. */
#define CALL_56(n, m, ...) \
  ((n)->v == 6 ? (n)->t6->m(__VA_ARGS__) : (n)->v == 5 ? (n)->t5->m(__VA_ARGS__) : NN_NO_MEMBER)

ncclResult_t nn_init(nn_t* n) {
  g_logger_given = 1;
  return CALL_ALL(n, init, nn_logger);
}
ncclResult_t nn_fini(nn_t* n) { return n->v == 6 ? n->t6->fini() : NN_NO_MEMBER; }
ncclResult_t nn_devices(nn_t* n, int* ndev) { return CALL_ALL(n, devices, ndev); }

ncclResult_t nn_props(nn_t* n, int dev, ncclNetProperties_v6_t* out) {
  memset(out, 0, sizeof *out);
  if (n->v != 4) return CALL_56(n, getProperties, dev, out);
  ncclNetProperties_v4_t p4;
  memset(&p4, 0, sizeof p4);
  ncclResult_t r = n->t4->getProperties(dev, &p4);
  out->name = p4.name;
  out->pciPath = p4.pciPath;
  out->guid = p4.guid;
  out->ptrSupport = p4.ptrSupport;
  out->speed = p4.speed;
  out->port = p4.port;
  out->maxComms = p4.maxComms;
  return r;
}

ncclResult_t nn_listen(nn_t* n, int dev, void* handle, void** lc) { return CALL_ALL(n, listen, dev, handle, lc); }
ncclResult_t nn_connect(nn_t* n, int dev, void* handle, void** sc) { return CALL_ALL(n, connect, dev, handle, sc); }
ncclResult_t nn_accept(nn_t* n, void* lc, void** rc) { return CALL_ALL(n, accept, lc, rc); }
ncclResult_t nn_regmr(nn_t* n, void* comm, void* data, size_t size, int type, void** mh) {
  return CALL_ALL(n, regMr, comm, data, size, type, mh);
}
ncclResult_t nn_deregmr(nn_t* n, void* comm, void* mh) { return CALL_ALL(n, deregMr, comm, mh); }

ncclResult_t nn_isend(nn_t* n, void* sc, void* data, int size, int tag, void* mh, void** req) {
  if (n->v == 4) return n->t4->isend(sc, data, size, mh, req);
  return CALL_56(n, isend, sc, data, size, tag, mh, req);
}

ncclResult_t nn_irecv1(nn_t* n, void* rc, void* data, int size, int tag, void* mh, void** req) {
  if (n->v == 4) return n->t4->irecv(rc, data, size, mh, req);
  return CALL_56(n, irecv, rc, 1, &data, &size, &tag, &mh, req);
}

ncclResult_t nn_test(nn_t* n, void* req, int* done, int* sizes) { return CALL_ALL(n, test, req, done, sizes); }
ncclResult_t nn_close_send(nn_t* n, void* sc) { return CALL_ALL(n, closeSend, sc); }
ncclResult_t nn_close_recv(nn_t* n, void* rc) { return CALL_ALL(n, closeRecv, rc); }
ncclResult_t nn_close_listen(nn_t* n, void* lc) { return CALL_ALL(n, closeListen, lc); }

ncclResult_t nn_irecv(nn_t* n, void* rc, int nr, void** data, int* sizes, int* tags, void** mhs, void** req) {
  return CALL_56(n, irecv, rc, nr, data, sizes, tags, mhs, req);
}
ncclResult_t nn_iflush(nn_t* n, void* rc, int nr, void** data, int* sizes, void** mhs, void** req) {
  return CALL_56(n, iflush, rc, nr, data, sizes, mhs, req);
}
ncclResult_t nn_regmr_dmabuf(nn_t* n, void* comm, void* data, size_t size, int type, uint64_t off, int fd,
                             void** mh) {
  return CALL_56(n, regMrDmaBuf, comm, data, size, type, off, fd, mh);
}
ncclResult_t nn_getmrkey(nn_t* n, void* mh, uint64_t* key) { return CALL_56(n, getMrKey, mh, key); }
ncclResult_t nn_iwrite(nn_t* n, void* sc, void* src, size_t size, void* mh, uint64_t dest, uint64_t key,
                       void** req) {
  return CALL_56(n, iwrite, sc, src, size, mh, dest, key, req);
}
ncclResult_t nn_iwrite_inline(nn_t* n, void* sc, void* src, size_t size, uint64_t dest, uint64_t key, void** req) {
  return CALL_56(n, iwriteInline, sc, src, size, dest, key, req);
}
ncclResult_t nn_iread(nn_t* n, void* rc, void* dest, size_t size, void* mh, uint64_t src, uint64_t key,
                      void** req) {
  return CALL_56(n, iread, rc, dest, size, mh, src, key, req);
}

/* ---------------------------------------------------------------------------- setup, teardown */

int std_setup(rctx_t* c, int version) {
  char err[512];
  stagef(c, "dlopen %s (ncclNetPlugin_v%d)", g_lib, version);
  if (nn_open(&c->n, g_lib, version, err, sizeof err) != 0) return failf(c, "%s", err);
  stagef(c, "v%d init", version);
  ncclResult_t r = nn_init(&c->n);
  if (r != ncclSuccess) return failf(c, "v%d init returned %d (%s)", version, r, rstr(r));
  r = nn_devices(&c->n, &c->ndev);
  if (r != ncclSuccess) return failf(c, "v%d devices returned %d (%s)", version, r, rstr(r));
  if (c->ndev < 1) return failf(c, "v%d devices reported %d devices", version, c->ndev);
  r = nn_props(&c->n, 0, &c->props);
  if (r != ncclSuccess) return failf(c, "v%d getProperties(0) returned %d (%s)", version, r, rstr(r));
  return 0;
}

int std_teardown(rctx_t* c) {
  if (c->n.v == 6) {
    stagef(c, "v6 fini");
    ncclResult_t r = nn_fini(&c->n);
    if (r != ncclSuccess) return failf(c, "v6 fini returned %d (%s)", r, rstr(r));
  }
  nn_close_dl(&c->n);
  return 0;
}

/* ------------------------------------------------------------------------------- connections */

int pair_one_way(rctx_t* c, int con, int lis, void** sc, void** rc, int slot, unsigned seq, const char* what) {
  *sc = *rc = NULL;
  const int hsz = c->n.v == 4 ? NCCL_NET_HANDLE_MAXSIZE_V4 : HSIZE;
  if (c->hc.rank == lis) {
    unsigned char handle[HSIZE];
    memset(handle, 0, sizeof handle);
    void* lc = NULL;
    stagef(c, "%s: listen", what);
    ncclResult_t r = nn_listen(&c->n, 0, handle, &lc);
    if (r != ncclSuccess || !lc) return failf(c, "%s: listen returned %d (%s), listenComm %p", what, r, rstr(r), lc);
    publish(c, slot, seq, handle);
    int64_t deadline = op_deadline(c);
    int spins = 0;
    stagef(c, "%s: accept", what);
    while (!*rc) { /* v4 accept blocks: one call */
      r = nn_accept(&c->n, lc, rc);
      if (r != ncclSuccess) return failf(c, "%s: accept returned %d (%s)", what, r, rstr(r));
      if (*rc) break;
      if (c->n.v == 4) return failf(c, "%s: blocking v4 accept returned Success with a NULL recvComm", what);
      if (check_abort(c)) return -1;
      if (now_ns() > deadline) return failf(c, "%s: accept did not complete within %d ms", what, g_op_timeout_ms);
      backoff(&spins);
    }
    r = nn_close_listen(&c->n, lc);
    if (r != ncclSuccess) return failf(c, "%s: closeListen returned %d (%s)", what, r, rstr(r));
  } else if (c->hc.rank == con) {
    unsigned char tmp[HSIZE];
    if (fetch(c, lis, slot, seq, tmp, "listen handle")) return -1;
    /* A heap buffer of exactly the version's handle size: ASan sees any access past it. */
    unsigned char* handle = malloc((size_t)hsz);
    if (!handle) return failf(c, "out of memory");
    memcpy(handle, tmp, (size_t)hsz);
    int64_t deadline = op_deadline(c);
    int spins = 0;
    stagef(c, "%s: connect", what);
    for (;;) {
      ncclResult_t r = nn_connect(&c->n, 0, handle, sc);
      if (r != ncclSuccess) {
        free(handle);
        return failf(c, "%s: connect returned %d (%s)", what, r, rstr(r));
      }
      if (*sc) break;
      if (c->n.v == 4) {
        free(handle);
        return failf(c, "%s: blocking v4 connect returned Success with a NULL sendComm", what);
      }
      if (check_abort(c) || now_ns() > deadline) {
        free(handle);
        return c->hc.aborted ? -1 : failf(c, "%s: connect did not complete within %d ms", what, g_op_timeout_ms);
      }
      backoff(&spins);
    }
    free(handle);
  }
  return 0;
}

int pair_loopback(rctx_t* c, void** sc, void** rc, const char* what) {
  *sc = *rc = NULL;
  unsigned char* handle = calloc(1, HSIZE); /* exactly 128 bytes, on the heap for ASan */
  if (!handle) return failf(c, "out of memory");
  void* lc = NULL;
  ncclResult_t r = nn_listen(&c->n, 0, handle, &lc);
  if (r != ncclSuccess || !lc) {
    free(handle);
    return failf(c, "%s: listen returned %d (%s), listenComm %p", what, r, rstr(r), lc);
  }
  int64_t deadline = op_deadline(c);
  int spins = 0, calls = 0;
  stagef(c, "%s: connect and accept alternately in one thread", what);
  while (!*sc || !*rc) {
    calls++;
    if (!*sc && (r = nn_connect(&c->n, 0, handle, sc)) != ncclSuccess) break;
    if (!*rc && (r = nn_accept(&c->n, lc, rc)) != ncclSuccess) break;
    if (now_ns() > deadline) break;
    backoff(&spins);
  }
  free(handle);
  if (r != ncclSuccess) return failf(c, "%s: connect/accept returned %d (%s) after %d rounds", what, r, rstr(r), calls);
  if (!*sc || !*rc)
    return failf(c, "%s: not connected within %d ms (sendComm %p, recvComm %p after %d rounds)", what, g_op_timeout_ms,
                 *sc, *rc, calls);
  r = nn_close_listen(&c->n, lc);
  if (r != ncclSuccess) return failf(c, "%s: closeListen returned %d (%s)", what, r, rstr(r));
  return 0;
}

/* --------------------------------------------------------------------------------- transfers */

/* isend or irecv, called again while the request comes back NULL ("busy"). */
static int post(rctx_t* c, int is_send, void* comm, void* data, int size, int tag, void* mh, void** req,
                const char* what) {
  int64_t deadline = op_deadline(c);
  int spins = 0;
  const char* call = is_send ? "isend" : "irecv";
  *req = NULL;
  for (;;) {
    ncclResult_t r = is_send ? nn_isend(&c->n, comm, data, size, tag, mh, req)
                             : nn_irecv1(&c->n, comm, data, size, tag, mh, req);
    if (r != ncclSuccess) return failf(c, "%s: %s(%d B) returned %d (%s)", what, call, size, r, rstr(r));
    if (*req) return 0;
    if (check_abort(c)) return -1;
    if (now_ns() > deadline) return failf(c, "%s: %s(%d B) kept returning a NULL request", what, call, size);
    backoff(&spins);
  }
}

int post_send(rctx_t* c, void* sc, void* data, int size, int tag, void* mh, void** req, const char* what) {
  return post(c, 1, sc, data, size, tag, mh, req, what);
}

int post_recv(rctx_t* c, void* rc, void* data, int size, int tag, void* mh, void** req, const char* what) {
  return post(c, 0, rc, data, size, tag, mh, req, what);
}

int wait_req(rctx_t* c, void* req, int* size_out, const char* what) {
  int64_t deadline = op_deadline(c);
  int spins = 0;
  for (;;) {
    int done = 0, sizes[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
    ncclResult_t r = nn_test(&c->n, req, &done, sizes);
    if (r != ncclSuccess) return failf(c, "%s: test returned %d (%s)", what, r, rstr(r));
    if (done) {
      if (size_out) *size_out = sizes[0];
      return 0;
    }
    if (check_abort(c)) return -1;
    if (now_ns() > deadline) return failf(c, "%s: request not done within %d ms", what, g_op_timeout_ms);
    backoff(&spins);
  }
}

#define CANARY 0xA5

int xfer(rctx_t* c, void* sc, void* smh, unsigned char* sbuf, void* rc, void* rmh, unsigned char* rbuf, size_t rcap,
         size_t size, uint64_t seed, const char* what) {
  void *sreq = NULL, *rreq = NULL;
  if (rc) {
    memset(rbuf, CANARY, rcap);
    if (post_recv(c, rc, rbuf, (int)rcap, 7, rmh, &rreq, what)) return -1;
  }
  if (sc) {
    pat_fill(sbuf, size, seed);
    if (post_send(c, sc, sbuf, (int)size, 7, smh, &sreq, what)) return -1;
  }
  /* Test both until done: a loopback pair needs both driven. */
  int sdone = !sc, rdone = !rc, got = -1;
  int64_t deadline = op_deadline(c);
  int spins = 0;
  while (!sdone || !rdone) {
    int done = 0, sizes[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
    if (!sdone) {
      ncclResult_t r = nn_test(&c->n, sreq, &done, sizes);
      if (r != ncclSuccess) return failf(c, "%s: test(send %zu B) returned %d (%s)", what, size, r, rstr(r));
      sdone = done;
    }
    if (!rdone) {
      done = 0;
      ncclResult_t r = nn_test(&c->n, rreq, &done, sizes);
      if (r != ncclSuccess) return failf(c, "%s: test(recv %zu B) returned %d (%s)", what, size, r, rstr(r));
      if (done) got = sizes[0];
      rdone = done;
    }
    if (check_abort(c)) return -1;
    if (now_ns() > deadline)
      return failf(c, "%s: %zu B not done within %d ms (send %s, recv %s)", what, size, g_op_timeout_ms,
                   sdone ? "done" : "pending", rdone ? "done" : "pending");
    backoff(&spins);
  }
  if (!rc) return 0;
  c->hc.checks += 3;
  if (got != (int)size) return failf(c, "%s: test reported %d bytes received, expected %zu", what, got, size);
  size_t nbad = 0;
  long first = pat_check_at(rbuf, size, seed, 0, &nbad);
  if (first >= 0)
    return failf(c, "%s: %zu of %zu received bytes differ, first at offset %ld", what, nbad, size, first);
  for (size_t i = size; i < rcap; i++)
    if (rbuf[i] != CANARY) return failf(c, "%s: byte %zu past the %zu-byte message was overwritten", what, i, size);
  return 0;
}

int regmr(rctx_t* c, void* comm, void* buf, size_t size, void** mh, const char* what) {
  *mh = NULL;
  ncclResult_t r = nn_regmr(&c->n, comm, buf, size, NCCL_PTR_HOST, mh);
  if (r != ncclSuccess) return failf(c, "%s: regMr(%zu B, HOST) returned %d (%s)", what, size, r, rstr(r));
  return 0;
}

int deregmr(rctx_t* c, void* comm, void* mh, const char* what) {
  ncclResult_t r = nn_deregmr(&c->n, comm, mh);
  if (r != ncclSuccess) return failf(c, "%s: deregMr returned %d (%s)", what, r, rstr(r));
  return 0;
}
