/*
 * nccl_net.h: the NCCL network-plugin ABI (ncclNet / ncclCollNet versions 6 to 12) as seen by a
 * caller of the plugin, written for the fabricoll test harness from the layout description in
 * docs/nccl-abi.md (x86_64). No NCCL source is copied; names follow NCCL's so that the harness
 * reads like NCCL's proxy code.
 *
 * Every size and offset the document states is checked with _Static_assert below. The CollNet
 * table sizes are not stated in the document; they are derived from its member lists (one
 * pointer per member) and checked the same way.
 */
#ifndef FABRICOLL_TEST_NCCL_NET_H
#define FABRICOLL_TEST_NCCL_NET_H

#include <stddef.h>
#include <stdint.h>

#include "nccl_common.h"

/* ---------------------------------------------------------------- common types (doc section 1) */

/* NVIDIA's result codes after the common ones (Neuron's ABI stops at ncclRemoteError). */
enum { ncclInProgress = 7, ncclTimeout = 8, ncclNumResults = 9 };

typedef enum {
  ncclInt8 = 0, ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2, ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6, ncclHalf = 6,
  ncclFloat32 = 7, ncclFloat = 7,
  ncclFloat64 = 8, ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4, ncclNumOps = 5 } ncclRedOp_t;

/* ncclDebugLogSubSys flags beyond the common ones (nccl_common.h) */
#define NCCL_GRAPH 0x20UL
#define NCCL_TUNING 0x40UL
#define NCCL_ENV 0x80UL
#define NCCL_ALLOC 0x100UL
#define NCCL_PROXY 0x400UL
#define NCCL_NVLS 0x800UL
#define NCCL_BOOTSTRAP 0x1000UL
#define NCCL_REG 0x2000UL
#define NCCL_PROFILE 0x4000UL
#define NCCL_RAS 0x8000UL
#define NCCL_DESTROY 0x10000UL
#define NCCL_ALLOC_HOST 0x20000UL

/* Profiler callback (type: Start 0, Stop 1, Update 2, UpdateAndStop 3). */
typedef ncclResult_t (*ncclProfilerCallback_t)(void** eHandle, int type, void* pHandle, int64_t pluginId,
                                               void* extData);

#define NCCL_PTR_DMABUF 0x4
#define NCCL_NET_MAX_REQUESTS 32
#define NCCL_NET_MAX_REQUESTS_V6 8
#define NCCL_MAX_NET_SIZE_BYTES (1ULL << 40)
#define NCCL_NET_MULTI_REQUEST 0x2
#define NCCL_NET_MAX_PLUGINS 16
#define NCCL_NET_TRAFFIC_CLASS_UNDEF (-1)
#define NCCL_NET_ID_UNDEF (-1)
#define NCCL_NET_MAX_DEVS_PER_NIC_V9 4
#define NCCL_NET_MAX_DEVS_PER_NIC_V10 4
#define NCCL_NET_MAX_DEVS_PER_NIC_V11 4
#define NCCL_NET_MAX_DEVS_PER_NIC_V12 8
#define NCCL_PROXY_MAX_SUBS 64 /* length of the sizes array NCCL gives test() for a receive */

/* net_device.h */
typedef enum {
  NCCL_NET_DEVICE_HOST = 0,
  NCCL_NET_DEVICE_UNPACK = 1,
  NCCL_NET_DEVICE_GIN_PROXY = 2,
  NCCL_NET_DEVICE_GIN_GDAKI = 3
} ncclNetDeviceType;

#define NCCL_NET_DEVICE_INVALID_VERSION 0x0
#define NCCL_NET_DEVICE_UNPACK_VERSION 0x7
#define NCCL_NET_MTU_SIZE 4096

typedef struct {
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
} ncclNetDeviceHandle_v7_t;
typedef ncclNetDeviceHandle_v7_t ncclNetDeviceHandle_v8_t;
typedef ncclNetDeviceHandle_v7_t ncclNetDeviceHandle_v9_t;
typedef ncclNetDeviceHandle_v7_t ncclNetDeviceHandle_v10_t;
typedef ncclNetDeviceHandle_v7_t ncclNetDeviceHandle_v11_t;
typedef ncclNetDeviceHandle_v7_t ncclNetDeviceHandle_v12_t;
typedef ncclNetDeviceHandle_v7_t ncclNetDeviceHandle_t;

_Static_assert(sizeof(ncclNetDeviceHandle_v7_t) == 32, "ncclNetDeviceHandle_v7_t size");
_Static_assert(offsetof(ncclNetDeviceHandle_v7_t, handle) == 8, "devhandle.handle");
_Static_assert(offsetof(ncclNetDeviceHandle_v7_t, size) == 16, "devhandle.size");
_Static_assert(offsetof(ncclNetDeviceHandle_v7_t, needsProxyProgress) == 24, "devhandle.needsProxyProgress");

/* ---------------------------------------------------------------- properties (doc section 2) */

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
} ncclNetProperties_v6_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
} ncclNetProperties_v7_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
} ncclNetProperties_v8_t;

typedef struct {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC_V9];
} ncclNetVDeviceProps_v9_t;
typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v10_t;
typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v11_t;

typedef struct {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC_V12];
} ncclNetVDeviceProps_v12_t;

_Static_assert(sizeof(ncclNetVDeviceProps_v9_t) == 20, "vProps v9 size");
_Static_assert(sizeof(ncclNetVDeviceProps_v12_t) == 36, "vProps v12 size");

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v9_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
} ncclNetProperties_v9_t;
typedef ncclNetProperties_v9_t ncclNetProperties_v10_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v11_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
} ncclNetProperties_v11_t;

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v12_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
  int16_t railId;
  int16_t planeId;
} ncclNetProperties_v12_t;

/* v6: 48 B */
_Static_assert(sizeof(ncclNetProperties_v6_t) == 48, "props v6 size");
_Static_assert(offsetof(ncclNetProperties_v6_t, guid) == 16, "props v6 guid");
_Static_assert(offsetof(ncclNetProperties_v6_t, ptrSupport) == 24, "props v6 ptrSupport");
_Static_assert(offsetof(ncclNetProperties_v6_t, speed) == 28, "props v6 speed");
_Static_assert(offsetof(ncclNetProperties_v6_t, port) == 32, "props v6 port");
_Static_assert(offsetof(ncclNetProperties_v6_t, latency) == 36, "props v6 latency");
_Static_assert(offsetof(ncclNetProperties_v6_t, maxComms) == 40, "props v6 maxComms");
_Static_assert(offsetof(ncclNetProperties_v6_t, maxRecvs) == 44, "props v6 maxRecvs");
/* v7: 56 B */
_Static_assert(sizeof(ncclNetProperties_v7_t) == 56, "props v7 size");
_Static_assert(offsetof(ncclNetProperties_v7_t, maxRecvs) == 44, "props v7 maxRecvs");
_Static_assert(offsetof(ncclNetProperties_v7_t, netDeviceType) == 48, "props v7 netDeviceType");
_Static_assert(offsetof(ncclNetProperties_v7_t, netDeviceVersion) == 52, "props v7 netDeviceVersion");
/* v8: 64 B, regIsGlobal at 28 shifts the rest by 4 */
_Static_assert(sizeof(ncclNetProperties_v8_t) == 64, "props v8 size");
_Static_assert(offsetof(ncclNetProperties_v8_t, regIsGlobal) == 28, "props v8 regIsGlobal");
_Static_assert(offsetof(ncclNetProperties_v8_t, speed) == 32, "props v8 speed");
_Static_assert(offsetof(ncclNetProperties_v8_t, maxRecvs) == 48, "props v8 maxRecvs");
_Static_assert(offsetof(ncclNetProperties_v8_t, netDeviceType) == 52, "props v8 netDeviceType");
_Static_assert(offsetof(ncclNetProperties_v8_t, netDeviceVersion) == 56, "props v8 netDeviceVersion");
/* v9 = v10: 104 B */
_Static_assert(sizeof(ncclNetProperties_v9_t) == 104, "props v9 size");
_Static_assert(offsetof(ncclNetProperties_v9_t, forceFlush) == 32, "props v9 forceFlush");
_Static_assert(offsetof(ncclNetProperties_v9_t, maxRecvs) == 52, "props v9 maxRecvs");
_Static_assert(offsetof(ncclNetProperties_v9_t, netDeviceType) == 56, "props v9 netDeviceType");
_Static_assert(offsetof(ncclNetProperties_v9_t, vProps) == 64, "props v9 vProps");
_Static_assert(offsetof(ncclNetProperties_v9_t, maxP2pBytes) == 88, "props v9 maxP2pBytes");
_Static_assert(offsetof(ncclNetProperties_v9_t, maxCollBytes) == 96, "props v9 maxCollBytes");
/* v11: 112 B */
_Static_assert(sizeof(ncclNetProperties_v11_t) == 112, "props v11 size");
_Static_assert(offsetof(ncclNetProperties_v11_t, maxP2pBytes) == 88, "props v11 maxP2pBytes");
_Static_assert(offsetof(ncclNetProperties_v11_t, maxMultiRequestSize) == 104, "props v11 maxMultiRequestSize");
/* v12: 128 B; vProps grows to 36 B so everything from offset 64 on moves */
_Static_assert(sizeof(ncclNetProperties_v12_t) == 128, "props v12 size");
_Static_assert(offsetof(ncclNetProperties_v12_t, vProps) == 64, "props v12 vProps");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxP2pBytes) == 104, "props v12 maxP2pBytes");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxCollBytes) == 112, "props v12 maxCollBytes");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxMultiRequestSize) == 120, "props v12 maxMultiRequestSize");
_Static_assert(offsetof(ncclNetProperties_v12_t, railId) == 124, "props v12 railId");
_Static_assert(offsetof(ncclNetProperties_v12_t, planeId) == 126, "props v12 planeId");

/* ------------------------------------------------------------ config / attributes (section 2) */

typedef struct {
  int trafficClass;
} ncclNetCommConfig_v10_t;
typedef ncclNetCommConfig_v10_t ncclNetCommConfig_v11_t;
typedef ncclNetCommConfig_v10_t ncclNetCommConfig_v12_t;

typedef struct {
  int32_t maxConcurrentPeers;
  int32_t minConcurrentPeers;
  int32_t maxFlowsPerPeer;
  int32_t minFlowsPerPeer;
} ncclNetCommAttr_v11_t;
typedef ncclNetCommAttr_v11_t ncclNetCommAttr_v12_t;

typedef struct {
  ncclNetCommAttr_v11_t sendCommAttr;
  ncclNetCommAttr_v11_t recvCommAttr;
  uint32_t op;
  uint32_t algo;
  uint32_t proto;
} ncclNetAttr_v11_t;
typedef ncclNetAttr_v11_t ncclNetAttr_v12_t;

_Static_assert(sizeof(ncclNetCommConfig_v10_t) == 4, "config size");
_Static_assert(sizeof(ncclNetCommAttr_v11_t) == 16, "commattr size");
_Static_assert(sizeof(ncclNetAttr_v11_t) == 44, "netattr size");

/* ------------------------------------------------------------------ ncclNet tables (section 3) */

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v6_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm);
  ncclResult_t (*regMr)(void* comm, void* data, int size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
} ncclNet_v6_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v7_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v7_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v7_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, int size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
} ncclNet_v7_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v8_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v8_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
} ncclNet_v8_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v9_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v9_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v9_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                        void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v9_t* props);
} ncclNet_v9_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v10_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v10_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v10_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                        void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                        void** phandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v10_t* props);
} ncclNet_v10_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config, ncclDebugLogger_t logFunction,
                       ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v11_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v11_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v11_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                        void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                        void** phandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v11_t* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v11_t* netAttr);
} ncclNet_v11_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* config, ncclDebugLogger_t logFunction,
                       ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v12_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v12_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                        void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                        void** phandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v12_t* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v12_t* netAttr);
} ncclNet_v12_t;

_Static_assert(sizeof(ncclNet_v6_t) == 136, "ncclNet_v6_t size");
_Static_assert(sizeof(ncclNet_v7_t) == 152, "ncclNet_v7_t size");
_Static_assert(sizeof(ncclNet_v8_t) == 152, "ncclNet_v8_t size");
_Static_assert(sizeof(ncclNet_v9_t) == 160, "ncclNet_v9_t size");
_Static_assert(sizeof(ncclNet_v10_t) == 160, "ncclNet_v10_t size");
_Static_assert(sizeof(ncclNet_v11_t) == 176, "ncclNet_v11_t size");
_Static_assert(sizeof(ncclNet_v12_t) == 176, "ncclNet_v12_t size");
/* member positions the document spells out (1-based member i sits at offset 8*(i-1)) */
_Static_assert(offsetof(ncclNet_v6_t, isend) == 8 * 10, "v6 isend is member 11");
_Static_assert(offsetof(ncclNet_v6_t, test) == 8 * 13, "v6 test is member 14");
_Static_assert(offsetof(ncclNet_v6_t, closeListen) == 8 * 16, "v6 closeListen is member 17");
_Static_assert(offsetof(ncclNet_v7_t, getDeviceMr) == 8 * 17, "v7 getDeviceMr is member 18");
_Static_assert(offsetof(ncclNet_v7_t, irecvConsumed) == 8 * 18, "v7 irecvConsumed is member 19");
_Static_assert(offsetof(ncclNet_v9_t, makeVDevice) == 8 * 19, "v9 makeVDevice is member 20");
_Static_assert(offsetof(ncclNet_v11_t, finalize) == 8 * 20, "v11 finalize is member 21");
_Static_assert(offsetof(ncclNet_v12_t, setNetAttr) == 8 * 21, "v12 setNetAttr is member 22");

/* ---------------------------------------------------------------- CollNet (doc section 4) */

typedef struct {
  void* mhandle;
  void* address;
  uint32_t size;
} ncclNetSGE_v8_t;

typedef struct {
  void* mhandle;
  void* address;
  size_t size;
} ncclNetSGE_v9_t;
typedef ncclNetSGE_v9_t ncclNetSGE_v10_t;
typedef ncclNetSGE_v9_t ncclNetSGE_v11_t;
typedef ncclNetSGE_v9_t ncclNetSGE_v12_t;

_Static_assert(sizeof(ncclNetSGE_v8_t) == 24, "SGE v8 size");
_Static_assert(sizeof(ncclNetSGE_v9_t) == 24, "SGE v9 size");
_Static_assert(offsetof(ncclNetSGE_v8_t, size) == 16, "SGE v8 size field");

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v6_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* handles[], int nranks, int rank, void* listenComm, void** collComm);
  ncclResult_t (*reduceSupport)(ncclDataType_t dataType, ncclRedOp_t redOp, int* supported);
  ncclResult_t (*regMr)(void* collComm, void* data, int size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* collComm, void* data, size_t size, int type, uint64_t offset, int fd,
                              void** mhandle);
  ncclResult_t (*deregMr)(void* collComm, void* mhandle);
  ncclResult_t (*iallreduce)(void* collComm, void* sendData, void* recvData, int count, ncclDataType_t dataType,
                             ncclRedOp_t redOp, void* sendMhandle, void* recvMhandle, void** request);
  ncclResult_t (*iflush)(void* collComm, void* data, int size, void* mhandle, void** request);
  ncclResult_t (*test)(void* request, int* done, int* size);
  ncclResult_t (*closeColl)(void* collComm);
  ncclResult_t (*closeListen)(void* listenComm);
} ncclCollNet_v6_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v7_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* handles[], int nranks, int rank, void* listenComm, void** collComm);
  ncclResult_t (*reduceSupport)(ncclDataType_t dataType, ncclRedOp_t redOp, int* supported);
  ncclResult_t (*regMr)(void* collComm, void* data, int size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* collComm, void* data, size_t size, int type, uint64_t offset, int fd,
                              void** mhandle);
  ncclResult_t (*deregMr)(void* collComm, void* mhandle);
  ncclResult_t (*iallreduce)(void* collComm, void* sendData, void* recvData, int count, ncclDataType_t dataType,
                             ncclRedOp_t redOp, void* sendMhandle, void* recvMhandle, void** request);
  ncclResult_t (*iflush)(void* collComm, void* data, int size, void* mhandle, void** request);
  ncclResult_t (*test)(void* request, int* done, int* size);
  ncclResult_t (*closeColl)(void* collComm);
  ncclResult_t (*closeListen)(void* listenComm);
} ncclCollNet_v7_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* handles[], int nranks, int rank, void* listenComm, void** collComm);
  ncclResult_t (*reduceSupport)(ncclDataType_t dataType, ncclRedOp_t redOp, int* supported);
  ncclResult_t (*regMr)(void* collComm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* collComm, void* data, size_t size, int type, uint64_t offset, int fd,
                              void** mhandle);
  ncclResult_t (*deregMr)(void* collComm, void* mhandle);
  ncclResult_t (*iallreduce)(void* collComm, void* sendData, void* recvData, int count, ncclDataType_t dataType,
                             ncclRedOp_t redOp, void* sendMhandle, void* recvMhandle, void** request);
  ncclResult_t (*iallgather)(void* collComm, void* sendData, int nRecvParts, ncclNetSGE_v8_t* recvParts,
                             size_t bytesPerRank, size_t windowOffset, size_t windowBytes, void* sendMhandle,
                             void** request);
  ncclResult_t (*ireducescatter)(void* collComm, int nSendParts, ncclNetSGE_v8_t* sendParts, void* recvData,
                                 size_t bytesPerRank, size_t windowOffset, size_t windowBytes,
                                 ncclDataType_t dataType, ncclRedOp_t redOp, void* recvMhandle, void** request);
  ncclResult_t (*iflush)(void* collComm, void* data, int size, void* mhandle, void** request);
  ncclResult_t (*test)(void* request, int* done, int* size);
  ncclResult_t (*closeColl)(void* collComm);
  ncclResult_t (*closeListen)(void* listenComm);
} ncclCollNet_v8_t;

/* v9 and v10 have the same CollNet members (init still takes only the logger) */
#define FABRICOLL_COLLNET_V9_BODY(PROPS, VPROPS, SGE)                                                             \
  const char* name;                                                                                              \
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);                                                           \
  ncclResult_t (*devices)(int* ndev);                                                                            \
  ncclResult_t (*getProperties)(int dev, PROPS * props);                                                         \
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);                                              \
  ncclResult_t (*connect)(void* handles[], int nranks, int rank, void* listenComm, void** collComm);             \
  ncclResult_t (*reduceSupport)(ncclDataType_t dataType, ncclRedOp_t redOp, int* supported);                     \
  ncclResult_t (*regMr)(void* collComm, void* data, size_t size, int type, void** mhandle);                      \
  ncclResult_t (*regMrDmaBuf)(void* collComm, void* data, size_t size, int type, uint64_t offset, int fd,        \
                              void** mhandle);                                                                   \
  ncclResult_t (*deregMr)(void* collComm, void* mhandle);                                                        \
  ncclResult_t (*iallreduce)(void* collComm, void* sendData, void* recvData, size_t count,                       \
                             ncclDataType_t dataType, ncclRedOp_t redOp, void* sendMhandle, void* recvMhandle,   \
                             void** request);                                                                    \
  ncclResult_t (*iallgather)(void* collComm, void* sendData, int nRecvParts, SGE* recvParts,                     \
                             size_t bytesPerRank, size_t windowOffset, size_t windowBytes, void* sendMhandle,    \
                             void** request);                                                                    \
  ncclResult_t (*ireducescatter)(void* collComm, int nSendParts, SGE* sendParts, void* recvData,                 \
                                 size_t bytesPerRank, size_t windowOffset, size_t windowBytes,                   \
                                 ncclDataType_t dataType, ncclRedOp_t redOp, void* recvMhandle, void** request); \
  ncclResult_t (*iflush)(void* collComm, void* data, int size, void* mhandle, void** request);                   \
  ncclResult_t (*test)(void* request, int* done, int* size);                                                     \
  ncclResult_t (*closeColl)(void* collComm);                                                                     \
  ncclResult_t (*closeListen)(void* listenComm);                                                                 \
  ncclResult_t (*makeVDevice)(int* d, VPROPS* props);

typedef struct {
  FABRICOLL_COLLNET_V9_BODY(ncclNetProperties_v9_t, ncclNetVDeviceProps_v9_t, ncclNetSGE_v9_t)
} ncclCollNet_v9_t;

typedef struct {
  FABRICOLL_COLLNET_V9_BODY(ncclNetProperties_v10_t, ncclNetVDeviceProps_v10_t, ncclNetSGE_v10_t)
} ncclCollNet_v10_t;
#undef FABRICOLL_COLLNET_V9_BODY

/* v11 and v12: init(ctx, commId, logger), listen takes ctx first, finalize at the end */
#define FABRICOLL_COLLNET_V11_BODY(PROPS, VPROPS, SGE)                                                            \
  const char* name;                                                                                              \
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclDebugLogger_t logFunction);                              \
  ncclResult_t (*devices)(int* ndev);                                                                            \
  ncclResult_t (*getProperties)(int dev, PROPS * props);                                                         \
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);                                   \
  ncclResult_t (*connect)(void* handles[], int nranks, int rank, void* listenComm, void** collComm);             \
  ncclResult_t (*reduceSupport)(ncclDataType_t dataType, ncclRedOp_t redOp, int* supported);                     \
  ncclResult_t (*regMr)(void* collComm, void* data, size_t size, int type, void** mhandle);                      \
  ncclResult_t (*regMrDmaBuf)(void* collComm, void* data, size_t size, int type, uint64_t offset, int fd,        \
                              void** mhandle);                                                                   \
  ncclResult_t (*deregMr)(void* collComm, void* mhandle);                                                        \
  ncclResult_t (*iallreduce)(void* collComm, void* sendData, void* recvData, size_t count,                       \
                             ncclDataType_t dataType, ncclRedOp_t redOp, void* sendMhandle, void* recvMhandle,   \
                             void** request);                                                                    \
  ncclResult_t (*iallgather)(void* collComm, void* sendData, int nRecvParts, SGE* recvParts,                     \
                             size_t bytesPerRank, size_t windowOffset, size_t windowBytes, void* sendMhandle,    \
                             void** request);                                                                    \
  ncclResult_t (*ireducescatter)(void* collComm, int nSendParts, SGE* sendParts, void* recvData,                 \
                                 size_t bytesPerRank, size_t windowOffset, size_t windowBytes,                   \
                                 ncclDataType_t dataType, ncclRedOp_t redOp, void* recvMhandle, void** request); \
  ncclResult_t (*iflush)(void* collComm, void* data, int size, void* mhandle, void** request);                   \
  ncclResult_t (*test)(void* request, int* done, int* size);                                                     \
  ncclResult_t (*closeColl)(void* collComm);                                                                     \
  ncclResult_t (*closeListen)(void* listenComm);                                                                 \
  ncclResult_t (*makeVDevice)(int* d, VPROPS* props);                                                            \
  ncclResult_t (*finalize)(void* ctx);

typedef struct {
  FABRICOLL_COLLNET_V11_BODY(ncclNetProperties_v11_t, ncclNetVDeviceProps_v11_t, ncclNetSGE_v11_t)
} ncclCollNet_v11_t;

typedef struct {
  FABRICOLL_COLLNET_V11_BODY(ncclNetProperties_v12_t, ncclNetVDeviceProps_v12_t, ncclNetSGE_v12_t)
} ncclCollNet_v12_t;
#undef FABRICOLL_COLLNET_V11_BODY

/* Sizes derived from the member lists of doc section 4 (name + function pointers). */
_Static_assert(sizeof(ncclCollNet_v6_t) == 15 * 8, "ncclCollNet_v6_t: name + 14 functions");
_Static_assert(sizeof(ncclCollNet_v7_t) == 15 * 8, "ncclCollNet_v7_t: same members as v6");
_Static_assert(sizeof(ncclCollNet_v8_t) == 17 * 8, "ncclCollNet_v8_t: + iallgather, ireducescatter");
_Static_assert(sizeof(ncclCollNet_v9_t) == 18 * 8, "ncclCollNet_v9_t: + makeVDevice");
_Static_assert(sizeof(ncclCollNet_v10_t) == 18 * 8, "ncclCollNet_v10_t: same as v9");
_Static_assert(sizeof(ncclCollNet_v11_t) == 19 * 8, "ncclCollNet_v11_t: + finalize");
_Static_assert(sizeof(ncclCollNet_v12_t) == 19 * 8, "ncclCollNet_v12_t: same as v11");
/* "v6 and v7 lack items 12-13, so in them iflush directly follows iallreduce" */
_Static_assert(offsetof(ncclCollNet_v6_t, iflush) == offsetof(ncclCollNet_v6_t, iallreduce) + 8, "v6 iflush");
_Static_assert(offsetof(ncclCollNet_v7_t, iflush) == offsetof(ncclCollNet_v7_t, iallreduce) + 8, "v7 iflush");
_Static_assert(offsetof(ncclCollNet_v8_t, iallgather) == 8 * 11, "v8 iallgather is member 12");
_Static_assert(offsetof(ncclCollNet_v8_t, iflush) == 8 * 13, "v8 iflush is member 14");
_Static_assert(offsetof(ncclCollNet_v9_t, makeVDevice) == 8 * 17, "v9 makeVDevice is member 18");
_Static_assert(offsetof(ncclCollNet_v11_t, finalize) == 8 * 18, "v11 finalize is member 19");

#endif /* FABRICOLL_TEST_NCCL_NET_H */
