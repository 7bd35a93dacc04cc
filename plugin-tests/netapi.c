/* netapi.c: see netapi.h. */
#include "netapi.h"

#include <dlfcn.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

atomic_long net_logger_calls;
atomic_long net_logger_bad_calls;

int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

double ms_since(int64_t t0) { return (double)(now_ns() - t0) / 1e6; }

int verbose(void) {
  static int v = -1;
  if (v < 0) {
    const char* e = getenv("HARNESS_VERBOSE");
    v = (e && *e && strcmp(e, "0") != 0) ? 1 : 0;
  }
  return v;
}

void vlog(const char* fmt, ...) {
  if (!verbose()) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
}

void net_logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  atomic_fetch_add(&net_logger_calls, 1);
  if (fmt == NULL || (int)level < NCCL_LOG_NONE || (int)level > NCCL_LOG_TRACE) {
    atomic_fetch_add(&net_logger_bad_calls, 1);
    if (fmt == NULL) return;
  }
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap); /* always format: bad varargs from the plugin crash here */
  va_end(ap);
  if (verbose())
    fprintf(stderr, "[plugin-log pid %d lvl %d flags 0x%lx %s:%d] %s\n", (int)getpid(), (int)level, flags,
            file ? file : "(null)", line, msg);
}

const char* net_symbol_name(int version) {
  static const char* names[] = {"ncclNetPlugin_v6", "ncclNetPlugin_v7",  "ncclNetPlugin_v8", "ncclNetPlugin_v9",
                                "ncclNetPlugin_v10", "ncclNetPlugin_v11", "ncclNetPlugin_v12"};
  if (version < NET_MIN_VERSION || version > NET_MAX_VERSION) return "?";
  return names[version - NET_MIN_VERSION];
}

const char* nccl_result_str(int r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    case ncclTimeout: return "ncclTimeout";
    case (int)NET_MISSING_MEMBER: return "(table member is NULL)";
    default: return "(unknown ncclResult_t)";
  }
}

int net_bind(net_t* n, void* dl, int version, char* err, size_t errlen) {
  memset(n, 0, sizeof *n);
  n->config.trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF;
  if (version < NET_MIN_VERSION || version > NET_MAX_VERSION) {
    snprintf(err, errlen, "unsupported plugin version %d", version);
    return -1;
  }
  dlerror();
  void* sym = dlsym(dl, net_symbol_name(version));
  if (sym == NULL) {
    const char* e = dlerror();
    snprintf(err, errlen, "dlsym(%s) failed: %s", net_symbol_name(version), e ? e : "symbol is NULL");
    return -1;
  }
  n->dl = dl;
  n->version = version;
  n->table = sym;
  switch (version) {
    case 6: n->t6 = sym; break;
    case 7: n->t7 = sym; break;
    case 8: n->t8 = sym; break;
    case 9: n->t9 = sym; break;
    case 10: n->t10 = sym; break;
    case 11: n->t11 = sym; break;
    case 12: n->t12 = sym; break;
  }
  return 0;
}

int net_open(net_t* n, const char* path, int version, char* err, size_t errlen) {
  dlerror();
  void* dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (dl == NULL) {
    const char* e = dlerror();
    snprintf(err, errlen, "dlopen(%s) failed: %s", path, e ? e : "?");
    memset(n, 0, sizeof *n);
    return -1;
  }
  if (net_bind(n, dl, version, err, errlen) != 0) {
    dlclose(dl);
    return -1;
  }
  return 0;
}

void net_dlclose(net_t* n) {
  if (n->dl) dlclose(n->dl);
  n->dl = NULL;
  n->table = NULL;
}

size_t net_props_size(int version) {
  switch (version) {
    case 6: return sizeof(ncclNetProperties_v6_t);
    case 7: return sizeof(ncclNetProperties_v7_t);
    case 8: return sizeof(ncclNetProperties_v8_t);
    case 9: return sizeof(ncclNetProperties_v9_t);
    case 10: return sizeof(ncclNetProperties_v10_t);
    case 11: return sizeof(ncclNetProperties_v11_t);
    case 12: return sizeof(ncclNetProperties_v12_t);
    default: return 0;
  }
}

#define COMMON_PROPS(p)               \
  do {                                \
    out->name = (p)->name;            \
    out->pciPath = (p)->pciPath;      \
    out->guid = (p)->guid;            \
    out->ptrSupport = (p)->ptrSupport; \
    out->speed = (p)->speed;          \
    out->port = (p)->port;            \
    out->latency = (p)->latency;      \
    out->maxComms = (p)->maxComms;    \
    out->maxRecvs = (p)->maxRecvs;    \
  } while (0)

void net_props_decode(int version, const void* buf, net_props_t* out) {
  memset(out, 0, sizeof *out);
  out->regIsGlobal = -1;
  out->forceFlush = -1;
  out->vndevs = -1;
  out->maxMultiRequestSize = -1;
  out->railId = NCCL_NET_ID_UNDEF;
  out->planeId = NCCL_NET_ID_UNDEF;
  switch (version) {
    case 6: {
      ncclNetProperties_v6_t p;
      memcpy(&p, buf, sizeof p);
      COMMON_PROPS(&p);
      break;
    }
    case 7: {
      ncclNetProperties_v7_t p;
      memcpy(&p, buf, sizeof p);
      COMMON_PROPS(&p);
      out->netDeviceType = (int)p.netDeviceType;
      out->netDeviceVersion = p.netDeviceVersion;
      break;
    }
    case 8: {
      ncclNetProperties_v8_t p;
      memcpy(&p, buf, sizeof p);
      COMMON_PROPS(&p);
      out->regIsGlobal = p.regIsGlobal;
      out->netDeviceType = (int)p.netDeviceType;
      out->netDeviceVersion = p.netDeviceVersion;
      break;
    }
    case 9:
    case 10: {
      ncclNetProperties_v9_t p;
      memcpy(&p, buf, sizeof p);
      COMMON_PROPS(&p);
      out->regIsGlobal = p.regIsGlobal;
      out->forceFlush = p.forceFlush;
      out->netDeviceType = (int)p.netDeviceType;
      out->netDeviceVersion = p.netDeviceVersion;
      out->vndevs = p.vProps.ndevs;
      for (int i = 0; i < NCCL_NET_MAX_DEVS_PER_NIC_V9; i++) out->vdevs[i] = p.vProps.devs[i];
      out->maxP2pBytes = p.maxP2pBytes;
      out->maxCollBytes = p.maxCollBytes;
      break;
    }
    case 11: {
      ncclNetProperties_v11_t p;
      memcpy(&p, buf, sizeof p);
      COMMON_PROPS(&p);
      out->regIsGlobal = p.regIsGlobal;
      out->forceFlush = p.forceFlush;
      out->netDeviceType = (int)p.netDeviceType;
      out->netDeviceVersion = p.netDeviceVersion;
      out->vndevs = p.vProps.ndevs;
      for (int i = 0; i < NCCL_NET_MAX_DEVS_PER_NIC_V11; i++) out->vdevs[i] = p.vProps.devs[i];
      out->maxP2pBytes = p.maxP2pBytes;
      out->maxCollBytes = p.maxCollBytes;
      out->maxMultiRequestSize = p.maxMultiRequestSize;
      break;
    }
    case 12: {
      ncclNetProperties_v12_t p;
      memcpy(&p, buf, sizeof p);
      COMMON_PROPS(&p);
      out->regIsGlobal = p.regIsGlobal;
      out->forceFlush = p.forceFlush;
      out->netDeviceType = (int)p.netDeviceType;
      out->netDeviceVersion = p.netDeviceVersion;
      out->vndevs = p.vProps.ndevs;
      for (int i = 0; i < NCCL_NET_MAX_DEVS_PER_NIC_V12; i++) out->vdevs[i] = p.vProps.devs[i];
      out->maxP2pBytes = p.maxP2pBytes;
      out->maxCollBytes = p.maxCollBytes;
      out->maxMultiRequestSize = p.maxMultiRequestSize;
      out->railId = p.railId;
      out->planeId = p.planeId;
      break;
    }
  }
}

/* Call a member whose signature is the same in every table version. */
#define CALL_SAME(n, member, ...)                                                              \
  do {                                                                                         \
    switch ((n)->version) {                                                                    \
      case 6: return (n)->t6->member ? (n)->t6->member(__VA_ARGS__) : NET_MISSING_MEMBER;      \
      case 7: return (n)->t7->member ? (n)->t7->member(__VA_ARGS__) : NET_MISSING_MEMBER;      \
      case 8: return (n)->t8->member ? (n)->t8->member(__VA_ARGS__) : NET_MISSING_MEMBER;      \
      case 9: return (n)->t9->member ? (n)->t9->member(__VA_ARGS__) : NET_MISSING_MEMBER;      \
      case 10: return (n)->t10->member ? (n)->t10->member(__VA_ARGS__) : NET_MISSING_MEMBER;   \
      case 11: return (n)->t11->member ? (n)->t11->member(__VA_ARGS__) : NET_MISSING_MEMBER;   \
      case 12: return (n)->t12->member ? (n)->t12->member(__VA_ARGS__) : NET_MISSING_MEMBER;   \
      default: return ncclInternalError;                                                       \
    }                                                                                          \
  } while (0)

#define CHECKED(fp, ...) ((fp) ? (fp)(__VA_ARGS__) : NET_MISSING_MEMBER)

ncclResult_t net_init(net_t* n, uint64_t commId) {
  ncclResult_t r;
  switch (n->version) {
    case 6: r = CHECKED(n->t6->init, net_logger); break;
    case 7: r = CHECKED(n->t7->init, net_logger); break;
    case 8: r = CHECKED(n->t8->init, net_logger); break;
    case 9: r = CHECKED(n->t9->init, net_logger); break;
    case 10: r = CHECKED(n->t10->init, net_logger, NULL); break;
    case 11: r = CHECKED(n->t11->init, &n->ctx, commId, &n->config, net_logger, NULL); break;
    case 12: r = CHECKED(n->t12->init, &n->ctx, commId, &n->config, net_logger, NULL); break;
    default: r = ncclInternalError;
  }
  if (r == ncclSuccess) n->initialized = 1;
  return r;
}

ncclResult_t net_finalize(net_t* n) {
  if (!n->initialized) return ncclSuccess;
  n->initialized = 0;
  switch (n->version) {
    case 11: return CHECKED(n->t11->finalize, n->ctx);
    case 12: return CHECKED(n->t12->finalize, n->ctx);
    default: return ncclSuccess; /* v6-v10 have no finalize */
  }
}

ncclResult_t net_devices(net_t* n, int* ndev) { CALL_SAME(n, devices, ndev); }

ncclResult_t net_get_props_raw(net_t* n, int dev, void* buf) {
  switch (n->version) {
    case 6: return CHECKED(n->t6->getProperties, dev, buf);
    case 7: return CHECKED(n->t7->getProperties, dev, buf);
    case 8: return CHECKED(n->t8->getProperties, dev, buf);
    case 9: return CHECKED(n->t9->getProperties, dev, buf);
    case 10: return CHECKED(n->t10->getProperties, dev, buf);
    case 11: return CHECKED(n->t11->getProperties, dev, buf);
    case 12: return CHECKED(n->t12->getProperties, dev, buf);
    default: return ncclInternalError;
  }
}

ncclResult_t net_get_props(net_t* n, int dev, net_props_t* out) {
  _Alignas(16) unsigned char buf[256];
  memset(buf, 0, sizeof buf);
  ncclResult_t r = net_get_props_raw(n, dev, buf);
  if (r == ncclSuccess) net_props_decode(n->version, buf, out);
  return r;
}

ncclResult_t net_listen(net_t* n, int dev, void* handle, void** listenComm) {
  switch (n->version) {
    case 6: return CHECKED(n->t6->listen, dev, handle, listenComm);
    case 7: return CHECKED(n->t7->listen, dev, handle, listenComm);
    case 8: return CHECKED(n->t8->listen, dev, handle, listenComm);
    case 9: return CHECKED(n->t9->listen, dev, handle, listenComm);
    case 10: return CHECKED(n->t10->listen, dev, handle, listenComm);
    case 11: return CHECKED(n->t11->listen, n->ctx, dev, handle, listenComm);
    case 12: return CHECKED(n->t12->listen, n->ctx, dev, handle, listenComm);
    default: return ncclInternalError;
  }
}

ncclResult_t net_connect(net_t* n, int dev, void* handle, void** sendComm) {
  ncclNetDeviceHandle_v7_t* dh = NULL;
  ncclNetDeviceHandle_v7_t** dhp = n->devcomm_null ? NULL : &dh;
  ncclResult_t r;
  switch (n->version) {
    case 6: r = CHECKED(n->t6->connect, dev, handle, sendComm); break;
    case 7: r = CHECKED(n->t7->connect, dev, handle, sendComm, dhp); break;
    case 8: r = CHECKED(n->t8->connect, dev, handle, sendComm, dhp); break;
    case 9: r = CHECKED(n->t9->connect, dev, handle, sendComm, dhp); break;
    case 10: r = CHECKED(n->t10->connect, dev, &n->config, handle, sendComm, dhp); break;
    case 11: r = CHECKED(n->t11->connect, n->ctx, dev, handle, sendComm, dhp); break;
    case 12: r = CHECKED(n->t12->connect, n->ctx, dev, handle, sendComm, dhp); break;
    default: r = ncclInternalError;
  }
  if (dh != NULL) n->devcomm_written++;
  return r;
}

ncclResult_t net_accept(net_t* n, void* listenComm, void** recvComm) {
  ncclNetDeviceHandle_v7_t* dh = NULL;
  ncclNetDeviceHandle_v7_t** dhp = n->devcomm_null ? NULL : &dh;
  ncclResult_t r;
  switch (n->version) {
    case 6: r = CHECKED(n->t6->accept, listenComm, recvComm); break;
    case 7: r = CHECKED(n->t7->accept, listenComm, recvComm, dhp); break;
    case 8: r = CHECKED(n->t8->accept, listenComm, recvComm, dhp); break;
    case 9: r = CHECKED(n->t9->accept, listenComm, recvComm, dhp); break;
    case 10: r = CHECKED(n->t10->accept, listenComm, recvComm, dhp); break;
    case 11: r = CHECKED(n->t11->accept, listenComm, recvComm, dhp); break;
    case 12: r = CHECKED(n->t12->accept, listenComm, recvComm, dhp); break;
    default: r = ncclInternalError;
  }
  if (dh != NULL) n->devcomm_written++;
  return r;
}

ncclResult_t net_regmr(net_t* n, void* comm, void* data, size_t size, int type, void** mhandle) {
  switch (n->version) {
    case 6: return CHECKED(n->t6->regMr, comm, data, size > INT_MAX ? -1 : (int)size, type, mhandle);
    case 7: return CHECKED(n->t7->regMr, comm, data, size > INT_MAX ? -1 : (int)size, type, mhandle);
    case 8: return CHECKED(n->t8->regMr, comm, data, size, type, mhandle);
    case 9: return CHECKED(n->t9->regMr, comm, data, size, type, mhandle);
    case 10: return CHECKED(n->t10->regMr, comm, data, size, type, mhandle);
    case 11: return CHECKED(n->t11->regMr, comm, data, size, type, mhandle);
    case 12: return CHECKED(n->t12->regMr, comm, data, size, type, mhandle);
    default: return ncclInternalError;
  }
}

ncclResult_t net_regmr_dmabuf(net_t* n, void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                              void** mhandle) {
  CALL_SAME(n, regMrDmaBuf, comm, data, size, type, offset, fd, mhandle);
}

ncclResult_t net_deregmr(net_t* n, void* comm, void* mhandle) { CALL_SAME(n, deregMr, comm, mhandle); }

ncclResult_t net_isend(net_t* n, void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request) {
  int isize = size > INT_MAX ? -1 : (int)size;
  switch (n->version) {
    case 6: return CHECKED(n->t6->isend, sendComm, data, isize, tag, mhandle, request);
    case 7: return CHECKED(n->t7->isend, sendComm, data, isize, tag, mhandle, request);
    case 8: return CHECKED(n->t8->isend, sendComm, data, isize, tag, mhandle, request);
    case 9: return CHECKED(n->t9->isend, sendComm, data, size, tag, mhandle, request);
    case 10: return CHECKED(n->t10->isend, sendComm, data, size, tag, mhandle, NULL, request);
    case 11: return CHECKED(n->t11->isend, sendComm, data, size, tag, mhandle, NULL, request);
    case 12: return CHECKED(n->t12->isend, sendComm, data, size, tag, mhandle, NULL, request);
    default: return ncclInternalError;
  }
}

ncclResult_t net_irecv(net_t* n, void* recvComm, int nrecv, void** data, const size_t* sizes, int* tags,
                       void** mhandles, void** request) {
  if (n->version <= 8) {
    int isizes[NCCL_PROXY_MAX_SUBS];
    int cnt = nrecv < 0 ? 0 : (nrecv > NCCL_PROXY_MAX_SUBS ? NCCL_PROXY_MAX_SUBS : nrecv);
    for (int i = 0; i < NCCL_PROXY_MAX_SUBS; i++) isizes[i] = 0;
    for (int i = 0; i < cnt; i++) isizes[i] = sizes[i] > INT_MAX ? -1 : (int)sizes[i];
    switch (n->version) {
      case 6: return CHECKED(n->t6->irecv, recvComm, nrecv, data, isizes, tags, mhandles, request);
      case 7: return CHECKED(n->t7->irecv, recvComm, nrecv, data, isizes, tags, mhandles, request);
      case 8: return CHECKED(n->t8->irecv, recvComm, nrecv, data, isizes, tags, mhandles, request);
      default: return ncclInternalError;
    }
  }
  size_t* s = (size_t*)sizes; /* the plugin prototypes are not const-qualified */
  switch (n->version) {
    case 9: return CHECKED(n->t9->irecv, recvComm, nrecv, data, s, tags, mhandles, request);
    case 10: return CHECKED(n->t10->irecv, recvComm, nrecv, data, s, tags, mhandles, NULL, request);
    case 11: return CHECKED(n->t11->irecv, recvComm, nrecv, data, s, tags, mhandles, NULL, request);
    case 12: return CHECKED(n->t12->irecv, recvComm, nrecv, data, s, tags, mhandles, NULL, request);
    default: return ncclInternalError;
  }
}

ncclResult_t net_iflush(net_t* n, void* recvComm, int nrecv, void** data, int* sizes, void** mhandles,
                        void** request) {
  CALL_SAME(n, iflush, recvComm, nrecv, data, sizes, mhandles, request);
}

ncclResult_t net_test(net_t* n, void* request, int* done, int* sizes) { CALL_SAME(n, test, request, done, sizes); }
ncclResult_t net_close_send(net_t* n, void* sendComm) { CALL_SAME(n, closeSend, sendComm); }
ncclResult_t net_close_recv(net_t* n, void* recvComm) { CALL_SAME(n, closeRecv, recvComm); }
ncclResult_t net_close_listen(net_t* n, void* listenComm) { CALL_SAME(n, closeListen, listenComm); }

void backoff(int* spins) {
  int s = ++*spins;
  if (s < 64) return;
  if (s < 512) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, 20000};
  nanosleep(&ts, NULL);
}
