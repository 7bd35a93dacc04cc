/*
 * nccl_common.h: the declarations NVIDIA's net-plugin ABI (nccl_net.h) and Neuron's
 * (neuron_net.h) have in common, written once for the fabricoll tests: the result codes both
 * use, the logger type and levels, the logger's subsystem flags both name, and the pointer
 * kinds and handle size of the same value. Each ABI header includes this one and adds what is
 * its own (NVIDIA's result codes 7 to 9, its other subsystem flags, DMABUF vs NEURON for 0x4,
 * NCCL_NET_MAX_REQUESTS). Not included directly by the harnesses.
 */
#ifndef FABRICOLL_TEST_NCCL_COMMON_H
#define FABRICOLL_TEST_NCCL_COMMON_H

/* Result codes 0 to 6: the same in both ABIs. */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6
} ncclResult_t;
_Static_assert(sizeof(ncclResult_t) == 4, "ncclResult_t is a 4-byte enum");

typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;

/* Subsystem flags of the logger that both ABIs define. */
#define NCCL_INIT 0x1UL
#define NCCL_COLL 0x2UL
#define NCCL_P2P 0x4UL
#define NCCL_SHM 0x8UL
#define NCCL_NET 0x10UL
#define NCCL_CALL 0x200UL
#define NCCL_ALL (~0UL)

/* The logger is variadic. */
typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                                  const char* fmt, ...);

/* Pointer kinds (ptrSupport bits, regMr type) of the same meaning in both; 0x4 is NVIDIA's DMABUF
 * and Neuron's NEURON, so each ABI header names it. */
#define NCCL_PTR_HOST 0x1
#define NCCL_PTR_CUDA 0x2

#define NCCL_NET_HANDLE_MAXSIZE 128
#define NCCL_NET_OPTIONAL_RECV_COMPLETION 0x1

#endif
