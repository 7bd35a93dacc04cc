/*
 * netapi.h: a version-independent wrapper over the ncclNet_v6..v12 tables of a dlopened plugin,
 * shared by net_harness and net_bench. Each wrapper calls the member of the table version that
 * was loaded, with that version's argument widths and order (int sizes for v6-v8 isend/irecv,
 * int regMr size for v6/v7, the v10 connect config argument, the v11+ ctx arguments).
 */
#ifndef FABRICOLL_TEST_NETAPI_H
#define FABRICOLL_TEST_NETAPI_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl_net.h"

#define NET_MIN_VERSION 6
#define NET_MAX_VERSION 12

/* A returned code that no plugin produces: the table lacks a member the wrapper needed. */
#define NET_MISSING_MEMBER ((ncclResult_t)1000)

typedef struct {
  const char* name;
  const char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;      /* v8+, else -1 */
  int forceFlush;       /* v9+, else -1 */
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;    /* v7+, else 0 */
  int netDeviceVersion; /* v7+, else 0 */
  int vndevs;           /* v9+, else -1 */
  int vdevs[NCCL_NET_MAX_DEVS_PER_NIC_V12];
  size_t maxP2pBytes;   /* v9+, else 0 */
  size_t maxCollBytes;  /* v9+, else 0 */
  int maxMultiRequestSize; /* v11+, else -1 */
  int railId;           /* v12, else NCCL_NET_ID_UNDEF */
  int planeId;          /* v12, else NCCL_NET_ID_UNDEF */
} net_props_t;

typedef struct {
  int version;
  void* dl;
  const void* table;
  const ncclNet_v6_t* t6;
  const ncclNet_v7_t* t7;
  const ncclNet_v8_t* t8;
  const ncclNet_v9_t* t9;
  const ncclNet_v10_t* t10;
  const ncclNet_v11_t* t11;
  const ncclNet_v12_t* t12;
  void* ctx;             /* v11+: from init */
  int initialized;
  int devcomm_null;      /* pass NULL devComm pointers to connect/accept (GDR-probe style) */
  int devcomm_written;   /* times the plugin stored a non-NULL device handle */
  ncclNetCommConfig_v12_t config; /* trafficClass = -1 */
} net_t;

int64_t now_ns(void);
double ms_since(int64_t t0);

/* Logger handed to init: formats every message (so bad format arguments would crash here),
 * counts calls, prints to stderr when HARNESS_VERBOSE is set. */
void net_logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
extern atomic_long net_logger_calls;
extern atomic_long net_logger_bad_calls; /* NULL fmt or level out of range */

int verbose(void);
void vlog(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

const char* net_symbol_name(int version);
const char* nccl_result_str(int r);

/* dlopen (RTLD_NOW|RTLD_LOCAL) + dlsym of ncclNetPlugin_v<version>. 0 or -1 with err set. */
int net_open(net_t* n, const char* path, int version, char* err, size_t errlen);
/* Bind a second table version from the same dl handle (symbols/versions scenarios). */
int net_bind(net_t* n, void* dl, int version, char* err, size_t errlen);
void net_dlclose(net_t* n);

size_t net_props_size(int version);
void net_props_decode(int version, const void* buf, net_props_t* out);

ncclResult_t net_init(net_t* n, uint64_t commId);
ncclResult_t net_finalize(net_t* n);
ncclResult_t net_devices(net_t* n, int* ndev);
ncclResult_t net_get_props_raw(net_t* n, int dev, void* buf);
ncclResult_t net_get_props(net_t* n, int dev, net_props_t* out);
ncclResult_t net_listen(net_t* n, int dev, void* handle, void** listenComm);
ncclResult_t net_connect(net_t* n, int dev, void* handle, void** sendComm);
ncclResult_t net_accept(net_t* n, void* listenComm, void** recvComm);
ncclResult_t net_regmr(net_t* n, void* comm, void* data, size_t size, int type, void** mhandle);
ncclResult_t net_regmr_dmabuf(net_t* n, void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                              void** mhandle);
ncclResult_t net_deregmr(net_t* n, void* comm, void* mhandle);
ncclResult_t net_isend(net_t* n, void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request);
ncclResult_t net_irecv(net_t* n, void* recvComm, int nrecv, void** data, const size_t* sizes, int* tags,
                       void** mhandles, void** request);
ncclResult_t net_iflush(net_t* n, void* recvComm, int nrecv, void** data, int* sizes, void** mhandles,
                        void** request);
ncclResult_t net_test(net_t* n, void* request, int* done, int* sizes);
ncclResult_t net_close_send(net_t* n, void* sendComm);
ncclResult_t net_close_recv(net_t* n, void* recvComm);
ncclResult_t net_close_listen(net_t* n, void* listenComm);

/* Polling back-off: spin first, then yield, then sleep briefly (2 cores shared by up to 4 ranks). */
void backoff(int* spins);

#endif
