/*
 * neuron_net.h: the Neuron net-plugin ABI of libnccom-net.so (ncclNetPlugin_v4, _v5, _v6) as seen
 * by its caller (libnccom), written for the fabricoll tests from the layout description in
 * docs/neuron-abi.md (x86_64). No upstream header is copied; names follow the upstream
 * ones so that the harness reads like the caller's code.
 *
 * The symbol names are NVIDIA's but the layouts differ, so this header must never be included
 * together with nccl_net.h. Every size and offset the document states is checked with
 * _Static_assert below.
 */
#ifndef FABRICOLL_TEST_NEURON_NET_H
#define FABRICOLL_TEST_NEURON_NET_H

#ifdef FABRICOLL_TEST_NCCL_NET_H
#error "neuron_net.h and nccl_net.h declare different layouts under the same names"
#endif

#include <stddef.h>
#include <stdint.h>

#include "nccl_common.h"

/* ------------------------------------------------------------------------- common (doc §0) */

/* ncclResult_t, the logger, its levels and flags, NCCL_PTR_HOST/CUDA, the handle size: nccl_common.h. */
#define NCCL_PTR_NEURON 0x4 /* the value of NVIDIA's DMABUF */
#define NCCL_NET_HANDLE_MAXSIZE_V4 64
#define NCCL_NET_MAX_REQUESTS 128

/* --------------------------------------------------------------------- properties (doc §1) */

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int speed; /* Mbps */
  int port;
  int maxComms;
} ncclNetProperties_v4_t;
_Static_assert(sizeof(ncclNetProperties_v4_t) == 40, "ncclNetProperties_v4_t size");
_Static_assert(_Alignof(ncclNetProperties_v4_t) == 8, "ncclNetProperties_v4_t alignment");
_Static_assert(offsetof(ncclNetProperties_v4_t, name) == 0, "v4 props.name");
_Static_assert(offsetof(ncclNetProperties_v4_t, pciPath) == 8, "v4 props.pciPath");
_Static_assert(offsetof(ncclNetProperties_v4_t, guid) == 16, "v4 props.guid");
_Static_assert(offsetof(ncclNetProperties_v4_t, ptrSupport) == 24, "v4 props.ptrSupport");
_Static_assert(offsetof(ncclNetProperties_v4_t, speed) == 28, "v4 props.speed");
_Static_assert(offsetof(ncclNetProperties_v4_t, port) == 32, "v4 props.port");
_Static_assert(offsetof(ncclNetProperties_v4_t, maxComms) == 36, "v4 props.maxComms");

typedef struct {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int speed; /* Mbps */
  int port;
  float latency; /* us */
  int maxComms;
  int maxRecvs;
  /* 4 bytes of padding */
  size_t max_write_inline_size;
  size_t max_mr_key_size;
  int rma_supported;
  /* 4 bytes of tail padding */
} ncclNetProperties_v6_t;
typedef ncclNetProperties_v6_t ncclNetProperties_v5_t; /* v5 uses the v6 struct */
_Static_assert(sizeof(ncclNetProperties_v6_t) == 80, "ncclNetProperties_v6_t size");
_Static_assert(_Alignof(ncclNetProperties_v6_t) == 8, "ncclNetProperties_v6_t alignment");
_Static_assert(offsetof(ncclNetProperties_v6_t, name) == 0, "v6 props.name");
_Static_assert(offsetof(ncclNetProperties_v6_t, pciPath) == 8, "v6 props.pciPath");
_Static_assert(offsetof(ncclNetProperties_v6_t, guid) == 16, "v6 props.guid");
_Static_assert(offsetof(ncclNetProperties_v6_t, ptrSupport) == 24, "v6 props.ptrSupport");
_Static_assert(offsetof(ncclNetProperties_v6_t, regIsGlobal) == 28, "v6 props.regIsGlobal");
_Static_assert(offsetof(ncclNetProperties_v6_t, speed) == 32, "v6 props.speed");
_Static_assert(offsetof(ncclNetProperties_v6_t, port) == 36, "v6 props.port");
_Static_assert(offsetof(ncclNetProperties_v6_t, latency) == 40, "v6 props.latency");
_Static_assert(offsetof(ncclNetProperties_v6_t, maxComms) == 44, "v6 props.maxComms");
_Static_assert(offsetof(ncclNetProperties_v6_t, maxRecvs) == 48, "v6 props.maxRecvs");
_Static_assert(offsetof(ncclNetProperties_v6_t, max_write_inline_size) == 56, "v6 props.max_write_inline_size");
_Static_assert(offsetof(ncclNetProperties_v6_t, max_mr_key_size) == 64, "v6 props.max_mr_key_size");
_Static_assert(offsetof(ncclNetProperties_v6_t, rma_supported) == 72, "v6 props.rma_supported");
_Static_assert(sizeof(ncclNetProperties_v5_t) == 80, "ncclNetProperties_v5_t size");

/* --------------------------------------------------------------------------- v4 (doc §1) */

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v4_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm); /* blocks */
  ncclResult_t (*accept)(void* listenComm, void** recvComm);       /* blocks */
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, int size, void* mhandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, void* data, int size, void* mhandle, void** request);
  ncclResult_t (*iflush)(void* recvComm, void* data, int size, void* mhandle, void** request);
  ncclResult_t (*test)(void* request, int* done, int* size);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
} ncclNet_v4_t;
_Static_assert(sizeof(ncclNet_v4_t) == 128, "ncclNet_v4_t size");
_Static_assert(offsetof(ncclNet_v4_t, name) == 0, "v4.name");
_Static_assert(offsetof(ncclNet_v4_t, init) == 8, "v4.init");
_Static_assert(offsetof(ncclNet_v4_t, devices) == 16, "v4.devices");
_Static_assert(offsetof(ncclNet_v4_t, getProperties) == 24, "v4.getProperties");
_Static_assert(offsetof(ncclNet_v4_t, listen) == 32, "v4.listen");
_Static_assert(offsetof(ncclNet_v4_t, connect) == 40, "v4.connect");
_Static_assert(offsetof(ncclNet_v4_t, accept) == 48, "v4.accept");
_Static_assert(offsetof(ncclNet_v4_t, regMr) == 56, "v4.regMr");
_Static_assert(offsetof(ncclNet_v4_t, deregMr) == 64, "v4.deregMr");
_Static_assert(offsetof(ncclNet_v4_t, isend) == 72, "v4.isend");
_Static_assert(offsetof(ncclNet_v4_t, irecv) == 80, "v4.irecv");
_Static_assert(offsetof(ncclNet_v4_t, iflush) == 88, "v4.iflush");
_Static_assert(offsetof(ncclNet_v4_t, test) == 96, "v4.test");
_Static_assert(offsetof(ncclNet_v4_t, closeSend) == 104, "v4.closeSend");
_Static_assert(offsetof(ncclNet_v4_t, closeRecv) == 112, "v4.closeRecv");
_Static_assert(offsetof(ncclNet_v4_t, closeListen) == 120, "v4.closeListen");

/* ------------------------------------------------------------------------- v5, v6 (doc §1) */

/* The slots from `devices` to `iread`: the same in v5 and v6, which has `fini` before them. */
#define NEURON_NET_V5_V6_SLOTS                                                                            \
  ncclResult_t (*devices)(int* ndev);                                                                     \
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v6_t* props);                                  \
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);                                       \
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm); /* never blocks */                     \
  ncclResult_t (*accept)(void* listenComm, void** recvComm);       /* never blocks */                     \
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);                   \
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,     \
                              void** mhandle);                                                            \
  ncclResult_t (*deregMr)(void* comm, void* mhandle);                                                     \
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);    \
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,       \
                        void** request);                                                                  \
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request); \
  ncclResult_t (*test)(void* request, int* done, int* sizes);                                             \
  ncclResult_t (*closeSend)(void* sendComm);                                                              \
  ncclResult_t (*closeRecv)(void* recvComm);                                                              \
  ncclResult_t (*closeListen)(void* listenComm);                                                          \
  ncclResult_t (*getMrKey)(void* mhandle, uint64_t* mr_key);                                              \
  ncclResult_t (*iwrite)(void* sComm, void* src, size_t size, void* src_mhandle, uint64_t dest,           \
                         uint64_t mr_key, void** request);                                                \
  ncclResult_t (*iwriteInline)(void* sComm, void* src, size_t size, uint64_t dest, uint64_t mr_key,       \
                               void** request);                                                           \
  ncclResult_t (*iread)(void* rComm, void* dest, size_t size, void* dest_mhandle, uint64_t src,           \
                        uint64_t mr_key, void** request);

/* The doc's offsets of those slots, `devices` being at `base`. */
#define NEURON_NET_ASSERT_SLOTS(T, base)                                            \
  _Static_assert(offsetof(T, devices) == (base), #T ".devices");                    \
  _Static_assert(offsetof(T, getProperties) == (base) + 8, #T ".getProperties");    \
  _Static_assert(offsetof(T, listen) == (base) + 16, #T ".listen");                 \
  _Static_assert(offsetof(T, connect) == (base) + 24, #T ".connect");               \
  _Static_assert(offsetof(T, accept) == (base) + 32, #T ".accept");                 \
  _Static_assert(offsetof(T, regMr) == (base) + 40, #T ".regMr");                   \
  _Static_assert(offsetof(T, regMrDmaBuf) == (base) + 48, #T ".regMrDmaBuf");       \
  _Static_assert(offsetof(T, deregMr) == (base) + 56, #T ".deregMr");               \
  _Static_assert(offsetof(T, isend) == (base) + 64, #T ".isend");                   \
  _Static_assert(offsetof(T, irecv) == (base) + 72, #T ".irecv");                   \
  _Static_assert(offsetof(T, iflush) == (base) + 80, #T ".iflush");                 \
  _Static_assert(offsetof(T, test) == (base) + 88, #T ".test");                     \
  _Static_assert(offsetof(T, closeSend) == (base) + 96, #T ".closeSend");           \
  _Static_assert(offsetof(T, closeRecv) == (base) + 104, #T ".closeRecv");          \
  _Static_assert(offsetof(T, closeListen) == (base) + 112, #T ".closeListen");      \
  _Static_assert(offsetof(T, getMrKey) == (base) + 120, #T ".getMrKey");            \
  _Static_assert(offsetof(T, iwrite) == (base) + 128, #T ".iwrite");                \
  _Static_assert(offsetof(T, iwriteInline) == (base) + 136, #T ".iwriteInline");    \
  _Static_assert(offsetof(T, iread) == (base) + 144, #T ".iread")

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  NEURON_NET_V5_V6_SLOTS
} ncclNet_v5_t;
_Static_assert(sizeof(ncclNet_v5_t) == 168, "ncclNet_v5_t size");
_Static_assert(offsetof(ncclNet_v5_t, name) == 0, "v5.name");
_Static_assert(offsetof(ncclNet_v5_t, init) == 8, "v5.init");
NEURON_NET_ASSERT_SLOTS(ncclNet_v5_t, 16); /* devices 16 ... getMrKey 136, iwrite 144, iread 160 */

typedef struct {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*fini)(void);
  NEURON_NET_V5_V6_SLOTS
} ncclNet_v6_t;
_Static_assert(sizeof(ncclNet_v6_t) == 176, "ncclNet_v6_t size");
_Static_assert(offsetof(ncclNet_v6_t, name) == 0, "v6.name");
_Static_assert(offsetof(ncclNet_v6_t, init) == 8, "v6.init");
_Static_assert(offsetof(ncclNet_v6_t, fini) == 16, "v6.fini");
NEURON_NET_ASSERT_SLOTS(ncclNet_v6_t, 24); /* devices 24 ... getMrKey 144, iwrite 152, iread 168 */
/* The doc's named offsets, once more by name. */
_Static_assert(offsetof(ncclNet_v5_t, regMrDmaBuf) == 64 && offsetof(ncclNet_v6_t, regMrDmaBuf) == 72, "regMrDmaBuf");
_Static_assert(offsetof(ncclNet_v5_t, getMrKey) == 136 && offsetof(ncclNet_v6_t, getMrKey) == 144, "getMrKey");
_Static_assert(offsetof(ncclNet_v5_t, iread) == 160 && offsetof(ncclNet_v6_t, iread) == 168, "iread");

#endif
