/*
 * collnet_harness: multi-process conformance tests and a benchmark for an NCCL CollNet plugin
 * (ncclCollNetPlugin_v6..v12), written for fabricoll.
 *
 *   collnet_harness --lib PATH [--scenario NAME[,NAME...]|all] [--skip NAME[,...]] [--ranks N[,N...]]
 *                   [--version 6..12] [--op-timeout-ms 60000] [--kill-timeout-ms 3000]
 *                   [--time-scale 1.0] [--list]
 *   collnet_harness --lib PATH --bench [--ranks R] [-b 64K] [-e 64M] [-f 2] [-n 20] [-w 5]
 *                   [--version 12] [-c 1]
 *
 * Process model (as net_harness): the parent never dlopens the plugin. For each scenario and rank
 * count it maps an anonymous MAP_SHARED region, forks the ranks, and each rank dlopens the plugin
 * itself. Every rank plays one CollNet "head" of NCCL (doc section 6): listen, all-gather the
 * 128-byte handles through the mapping, connect(handles[], nranks, rank, listenComm, &collComm) in
 * ONE call, closeListen. Ranks synchronise by polling the mapping with deadlines; nothing blocks
 * on a dead process, and the parent kills what is left at the scenario's deadline (with gdb
 * stacks of a hung rank when gdb is installed; HARNESS_NO_STACKS=1 turns that off).
 *
 * Without --ranks each scenario runs for 2, 3, 4 and 5 ranks (kill: 4 ranks only); --ranks 2,5 picks
 * rank counts (kill still 4); a single --ranks N runs every scenario with N ranks. Output:
 *   PASS <scenario> np<N> (details; seconds)     or     FAIL <scenario> np<N>: reason
 * then "collnet_harness: N passed, M failed" (exit status 1 on any failure).
 *
 * Environment: FABRICOLL_* pass through to the plugin, except that the kill ranks get
 * FABRICOLL_TIMEOUT_MS=<--kill-timeout-ms>. HARNESS_VERBOSE=1 prints progress and plugin logs.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <link.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "harness_common.h"
#include "harness_run.h"
#include "netapi.h"

/* ------------------------------------------------------------------------------ configuration */

static const char* g_lib;
static int g_version = 12;
static int g_op_timeout_ms = 60000;
static int g_kill_timeout_ms = 3000;
static double g_time_scale = 1.0;
static int g_kill_victim = 2;     /* set by the parent before forking the kill ranks */
static int g_print_matrix = 1;    /* support: rank 0 prints the table (first run only) */

#define MAXR 8
#define MAXCASE 1024
#define MAXSIZES 48
#define HSIZE NCCL_NET_HANDLE_MAXSIZE
#define CANARY 0xA5
#define GUARD 64 /* canary bytes before and after every buffer the plugin writes */

/* ================================================================= plugin logger */

/* Formats every message (bad varargs from the plugin would crash here); WARN messages always go to
 * stderr (the run's log), the others with HARNESS_VERBOSE. */
static atomic_long cn_logger_bad_calls;
static void cn_logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void cn_logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  if (fmt == NULL || (int)level < NCCL_LOG_NONE || (int)level > NCCL_LOG_TRACE) {
    atomic_fetch_add(&cn_logger_bad_calls, 1);
    if (fmt == NULL) return;
  }
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (verbose() || level == NCCL_LOG_WARN)
    fprintf(stderr, "[plugin-log pid %d lvl %d flags 0x%lx %s:%d] %s\n", (int)getpid(), (int)level, flags,
            file ? file : "(null)", line, msg);
}

/* ================================================================= CollNet table wrapper */

typedef struct {
  void* mhandle;
  void* address;
  size_t size;
} cn_sge_t;

typedef struct {
  int version;
  const void* table;
  const ncclCollNet_v6_t* t6;
  const ncclCollNet_v7_t* t7;
  const ncclCollNet_v8_t* t8;
  const ncclCollNet_v9_t* t9;
  const ncclCollNet_v10_t* t10;
  const ncclCollNet_v11_t* t11;
  const ncclCollNet_v12_t* t12;
  void* ctx; /* v11+ */
} cn_t;

static const char* cn_symbol_name(int v) {
  static const char* names[] = {"ncclCollNetPlugin_v6",  "ncclCollNetPlugin_v7",  "ncclCollNetPlugin_v8",
                                "ncclCollNetPlugin_v9",  "ncclCollNetPlugin_v10", "ncclCollNetPlugin_v11",
                                "ncclCollNetPlugin_v12"};
  if (v < NET_MIN_VERSION || v > NET_MAX_VERSION) return "?";
  return names[v - NET_MIN_VERSION];
}

static size_t cn_table_size(int v) {
  switch (v) {
    case 6: return sizeof(ncclCollNet_v6_t);
    case 7: return sizeof(ncclCollNet_v7_t);
    case 8: return sizeof(ncclCollNet_v8_t);
    case 9: return sizeof(ncclCollNet_v9_t);
    case 10: return sizeof(ncclCollNet_v10_t);
    case 11: return sizeof(ncclCollNet_v11_t);
    case 12: return sizeof(ncclCollNet_v12_t);
    default: return 0;
  }
}

static int cn_bind(cn_t* n, void* dl, int v, char* err, size_t errlen) {
  memset(n, 0, sizeof *n);
  dlerror();
  void* sym = dlsym(dl, cn_symbol_name(v));
  if (sym == NULL) {
    const char* e = dlerror();
    snprintf(err, errlen, "dlsym(%s) failed: %s", cn_symbol_name(v), e ? e : "symbol is NULL");
    return -1;
  }
  n->version = v;
  n->table = sym;
  switch (v) {
    case 6: n->t6 = sym; break;
    case 7: n->t7 = sym; break;
    case 8: n->t8 = sym; break;
    case 9: n->t9 = sym; break;
    case 10: n->t10 = sym; break;
    case 11: n->t11 = sym; break;
    case 12: n->t12 = sym; break;
    default: snprintf(err, errlen, "unsupported version %d", v); return -1;
  }
  return 0;
}

/* Members with the same signature in every version. */
#define CN_SAME(n, member, ...)                                                                \
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
#define CHK(fp, ...) ((fp) ? (fp)(__VA_ARGS__) : NET_MISSING_MEMBER)

static ncclResult_t cn_init(cn_t* n, uint64_t commId) {
  switch (n->version) {
    case 6: return CHK(n->t6->init, cn_logger);
    case 7: return CHK(n->t7->init, cn_logger);
    case 8: return CHK(n->t8->init, cn_logger);
    case 9: return CHK(n->t9->init, cn_logger);
    case 10: return CHK(n->t10->init, cn_logger);
    case 11: return CHK(n->t11->init, &n->ctx, commId, cn_logger);
    case 12: return CHK(n->t12->init, &n->ctx, commId, cn_logger);
    default: return ncclInternalError;
  }
}

static ncclResult_t cn_finalize(cn_t* n) {
  switch (n->version) {
    case 11: return CHK(n->t11->finalize, n->ctx);
    case 12: return CHK(n->t12->finalize, n->ctx);
    default: return ncclSuccess; /* v6..v10 have no finalize */
  }
}

static ncclResult_t cn_devices(cn_t* n, int* ndev) { CN_SAME(n, devices, ndev); }
static ncclResult_t cn_get_props_raw(cn_t* n, int dev, void* buf) { CN_SAME(n, getProperties, dev, buf); }

static ncclResult_t cn_listen(cn_t* n, int dev, void* handle, void** lc) {
  switch (n->version) {
    case 6: return CHK(n->t6->listen, dev, handle, lc);
    case 7: return CHK(n->t7->listen, dev, handle, lc);
    case 8: return CHK(n->t8->listen, dev, handle, lc);
    case 9: return CHK(n->t9->listen, dev, handle, lc);
    case 10: return CHK(n->t10->listen, dev, handle, lc);
    case 11: return CHK(n->t11->listen, n->ctx, dev, handle, lc);
    case 12: return CHK(n->t12->listen, n->ctx, dev, handle, lc);
    default: return ncclInternalError;
  }
}

static ncclResult_t cn_connect(cn_t* n, void** handles, int nranks, int rank, void* lc, void** cc) {
  CN_SAME(n, connect, handles, nranks, rank, lc, cc);
}
static ncclResult_t cn_reduce_support(cn_t* n, int dt, int op, int* supported) {
  CN_SAME(n, reduceSupport, (ncclDataType_t)dt, (ncclRedOp_t)op, supported);
}

static ncclResult_t cn_regmr(cn_t* n, void* cc, void* data, size_t size, int type, void** mh) {
  if (n->version <= 7 && size > (size_t)INT_MAX) return ncclInvalidArgument; /* not expressible */
  switch (n->version) {
    case 6: return CHK(n->t6->regMr, cc, data, (int)size, type, mh);
    case 7: return CHK(n->t7->regMr, cc, data, (int)size, type, mh);
    case 8: return CHK(n->t8->regMr, cc, data, size, type, mh);
    case 9: return CHK(n->t9->regMr, cc, data, size, type, mh);
    case 10: return CHK(n->t10->regMr, cc, data, size, type, mh);
    case 11: return CHK(n->t11->regMr, cc, data, size, type, mh);
    case 12: return CHK(n->t12->regMr, cc, data, size, type, mh);
    default: return ncclInternalError;
  }
}

static ncclResult_t cn_regmr_dmabuf(cn_t* n, void* cc, void* data, size_t size, int type, uint64_t off, int fd,
                                    void** mh) {
  CN_SAME(n, regMrDmaBuf, cc, data, size, type, off, fd, mh);
}
static ncclResult_t cn_deregmr(cn_t* n, void* cc, void* mh) { CN_SAME(n, deregMr, cc, mh); }

static ncclResult_t cn_iallreduce(cn_t* n, void* cc, void* s, void* r, size_t count, int dt, int op, void* smh,
                                  void* rmh, void** req) {
  if (n->version <= 8 && count > (size_t)INT_MAX) return ncclInvalidArgument;
  ncclDataType_t t = (ncclDataType_t)dt;
  ncclRedOp_t o = (ncclRedOp_t)op;
  switch (n->version) {
    case 6: return CHK(n->t6->iallreduce, cc, s, r, (int)count, t, o, smh, rmh, req);
    case 7: return CHK(n->t7->iallreduce, cc, s, r, (int)count, t, o, smh, rmh, req);
    case 8: return CHK(n->t8->iallreduce, cc, s, r, (int)count, t, o, smh, rmh, req);
    case 9: return CHK(n->t9->iallreduce, cc, s, r, count, t, o, smh, rmh, req);
    case 10: return CHK(n->t10->iallreduce, cc, s, r, count, t, o, smh, rmh, req);
    case 11: return CHK(n->t11->iallreduce, cc, s, r, count, t, o, smh, rmh, req);
    case 12: return CHK(n->t12->iallreduce, cc, s, r, count, t, o, smh, rmh, req);
    default: return ncclInternalError;
  }
}

#define CN_SGE9(dst, src, np)                 \
  ncclNetSGE_v9_t dst[4];                     \
  for (int i_ = 0; i_ < (np); i_++) {         \
    dst[i_].mhandle = (src)[i_].mhandle;      \
    dst[i_].address = (src)[i_].address;      \
    dst[i_].size = (src)[i_].size;            \
  }

static ncclResult_t cn_iallgather(cn_t* n, void* cc, void* send, int np, const cn_sge_t* parts, size_t bpr,
                                  size_t off, size_t wb, void* smh, void** req) {
  if (np < 1 || np > 4) return ncclInvalidArgument;
  if (n->version <= 7) return NET_MISSING_MEMBER;
  if (n->version == 8) {
    ncclNetSGE_v8_t p8[4];
    for (int i = 0; i < np; i++) {
      if (parts[i].size > UINT32_MAX) return ncclInvalidArgument;
      p8[i].mhandle = parts[i].mhandle;
      p8[i].address = parts[i].address;
      p8[i].size = (uint32_t)parts[i].size;
    }
    return CHK(n->t8->iallgather, cc, send, np, p8, bpr, off, wb, smh, req);
  }
  CN_SGE9(p9, parts, np);
  switch (n->version) {
    case 9: return CHK(n->t9->iallgather, cc, send, np, p9, bpr, off, wb, smh, req);
    case 10: return CHK(n->t10->iallgather, cc, send, np, p9, bpr, off, wb, smh, req);
    case 11: return CHK(n->t11->iallgather, cc, send, np, p9, bpr, off, wb, smh, req);
    case 12: return CHK(n->t12->iallgather, cc, send, np, p9, bpr, off, wb, smh, req);
    default: return ncclInternalError;
  }
}

static ncclResult_t cn_ireducescatter(cn_t* n, void* cc, int np, const cn_sge_t* parts, void* recv, size_t bpr,
                                      size_t off, size_t wb, int dt, int op, void* rmh, void** req) {
  if (np < 1 || np > 4) return ncclInvalidArgument;
  if (n->version <= 7) return NET_MISSING_MEMBER;
  ncclDataType_t t = (ncclDataType_t)dt;
  ncclRedOp_t o = (ncclRedOp_t)op;
  if (n->version == 8) {
    ncclNetSGE_v8_t p8[4];
    for (int i = 0; i < np; i++) {
      if (parts[i].size > UINT32_MAX) return ncclInvalidArgument;
      p8[i].mhandle = parts[i].mhandle;
      p8[i].address = parts[i].address;
      p8[i].size = (uint32_t)parts[i].size;
    }
    return CHK(n->t8->ireducescatter, cc, np, p8, recv, bpr, off, wb, t, o, rmh, req);
  }
  CN_SGE9(p9, parts, np);
  switch (n->version) {
    case 9: return CHK(n->t9->ireducescatter, cc, np, p9, recv, bpr, off, wb, t, o, rmh, req);
    case 10: return CHK(n->t10->ireducescatter, cc, np, p9, recv, bpr, off, wb, t, o, rmh, req);
    case 11: return CHK(n->t11->ireducescatter, cc, np, p9, recv, bpr, off, wb, t, o, rmh, req);
    case 12: return CHK(n->t12->ireducescatter, cc, np, p9, recv, bpr, off, wb, t, o, rmh, req);
    default: return ncclInternalError;
  }
}

static ncclResult_t cn_iflush(cn_t* n, void* cc, void* data, int size, void* mh, void** req) {
  CN_SAME(n, iflush, cc, data, size, mh, req);
}
static ncclResult_t cn_test(cn_t* n, void* req, int* done, int* size) { CN_SAME(n, test, req, done, size); }
static ncclResult_t cn_close_coll(cn_t* n, void* cc) { CN_SAME(n, closeColl, cc); }
static ncclResult_t cn_close_listen(cn_t* n, void* lc) { CN_SAME(n, closeListen, lc); }

/* Which members of table version v are NULL (for the symbols scenario). Returns a list in `out`. */
static int cn_null_members(const cn_t* n, char* out, size_t len, char* optional, size_t olen) {
  int bad = 0;
  out[0] = optional[0] = 0;
#define M(T, mem, opt)                                                                                   \
  do {                                                                                                   \
    if ((T)->mem == NULL) {                                                                              \
      if (opt) snprintf(optional + strlen(optional), olen - strlen(optional), "%s%s", optional[0] ? "," : "", #mem); \
      else {                                                                                             \
        bad++;                                                                                           \
        snprintf(out + strlen(out), len - strlen(out), "%s%s", out[0] ? "," : "", #mem);                 \
      }                                                                                                  \
    }                                                                                                    \
  } while (0)
#define COMMON(T)                 \
  M(T, init, 0);                  \
  M(T, devices, 0);               \
  M(T, getProperties, 0);         \
  M(T, listen, 0);                \
  M(T, connect, 0);               \
  M(T, reduceSupport, 0);         \
  M(T, regMr, 0);                 \
  M(T, regMrDmaBuf, 1);           \
  M(T, deregMr, 0);               \
  M(T, iallreduce, 0);            \
  M(T, iflush, 1);                \
  M(T, test, 0);                  \
  M(T, closeColl, 0);             \
  M(T, closeListen, 0)
  switch (n->version) {
    case 6: COMMON(n->t6); break;
    case 7: COMMON(n->t7); break;
    case 8: COMMON(n->t8); M(n->t8, iallgather, 0); M(n->t8, ireducescatter, 0); break;
    case 9: COMMON(n->t9); M(n->t9, iallgather, 0); M(n->t9, ireducescatter, 0); M(n->t9, makeVDevice, 1); break;
    case 10: COMMON(n->t10); M(n->t10, iallgather, 0); M(n->t10, ireducescatter, 0); M(n->t10, makeVDevice, 1); break;
    case 11:
      COMMON(n->t11); M(n->t11, iallgather, 0); M(n->t11, ireducescatter, 0); M(n->t11, makeVDevice, 1);
      M(n->t11, finalize, 0);
      break;
    case 12:
      COMMON(n->t12); M(n->t12, iallgather, 0); M(n->t12, ireducescatter, 0); M(n->t12, makeVDevice, 1);
      M(n->t12, finalize, 0);
      break;
  }
#undef COMMON
#undef M
  return bad;
}

/* ================================================================= data types */

static const int g_eltsize[12] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
static const char* g_tname[12] = {"int8", "uint8", "int32", "uint32", "int64", "uint64",
                                  "half", "float", "double", "bf16", "e4m3", "e5m2"};
static const char* g_oname[5] = {"sum", "prod", "max", "min", "avg"};
static const char* tname(int t) { return t >= 0 && t < 12 ? g_tname[t] : "?"; }
static const char* oname(int o) { return o >= 0 && o < 5 ? g_oname[o] : "?"; }
static int is_float(int t) { return t >= 6; }
static int is_signed_int(int t) { return t == 0 || t == 2 || t == 4; }

/* small float formats: exponent bits, mantissa bits, bias, IEEE specials (all-ones exponent) */
typedef struct {
  int E, M, bias, ieee;
} ffmt_t;
static const ffmt_t F16 = {5, 10, 15, 1}, BF16 = {8, 7, 127, 1}, E4M3 = {4, 3, 7, 0}, E5M2 = {5, 2, 15, 1};
static const ffmt_t* small_fmt(int t) {
  switch (t) {
    case 6: return &F16;
    case 9: return &BF16;
    case 10: return &E4M3;
    case 11: return &E5M2;
    default: return NULL;
  }
}
/* mantissa bits of every float type (for tolerances) */
static int mant_bits(int t) {
  switch (t) {
    case 6: return 10;
    case 7: return 23;
    case 8: return 52;
    case 9: return 7;
    case 10: return 3;
    case 11: return 2;
    default: return 0;
  }
}
/* smallest positive subnormal of each float type */
static double min_sub(int t) {
  switch (t) {
    case 6: return ldexp(1, -24);
    case 7: return ldexp(1, -149);
    case 8: return ldexp(1, -1074);
    case 9: return ldexp(1, -133);
    case 10: return ldexp(1, -9);
    case 11: return ldexp(1, -16);
    default: return 0;
  }
}

static double fdecode(const ffmt_t* f, unsigned bits, int* special) {
  unsigned emax = (1u << f->E) - 1, mmax = (1u << f->M) - 1;
  unsigned s = (bits >> (f->E + f->M)) & 1, e = (bits >> f->M) & emax, m = bits & mmax;
  *special = 0;
  if (f->ieee && e == emax) {
    *special = 1;
    return m ? NAN : (s ? -INFINITY : INFINITY);
  }
  if (!f->ieee && e == emax && m == mmax) {
    *special = 1;
    return NAN;
  }
  double v = e == 0 ? ldexp((double)m, 1 - f->bias - f->M) : ldexp((double)(m + (1u << f->M)), (int)e - f->bias - f->M);
  return s ? -v : v;
}

/* Encodes an exactly representable normal value (or 0). */
static unsigned fencode_exact(const ffmt_t* f, double v) {
  if (v == 0) return 0;
  unsigned s = v < 0;
  int ex;
  double fr = frexp(fabs(v), &ex); /* fabs(v) = fr * 2^ex, fr in [0.5, 1) */
  int e = ex - 1 + f->bias;
  if (e <= 0) { /* subnormal: |v| = m * 2^(1 - bias - M) */
    double sm = ldexp(fabs(v), f->bias - 1 + f->M);
    unsigned m = (unsigned)sm;
    if ((double)m != sm || m >= (1u << f->M)) {
      fprintf(stderr, "collnet_harness: internal error: %g not exactly representable\n", v);
      abort();
    }
    return (s << (f->E + f->M)) | m;
  }
  double mant = (2 * fr - 1) * (double)(1u << f->M);
  unsigned m = (unsigned)mant;
  if (e <= 0 || e >= (1 << f->E) || (double)m != mant) {
    fprintf(stderr, "collnet_harness: internal error: %g not exactly representable\n", v);
    abort();
  }
  return (s << (f->E + f->M)) | ((unsigned)e << f->M) | m;
}

/* Reads element i of a buffer of type t as a double (floats) or as raw bits (ints). */
static double load_f(int t, const void* buf, size_t i, int* special) {
  *special = 0;
  const unsigned char* p = (const unsigned char*)buf + i * (size_t)g_eltsize[t];
  switch (t) {
    case 7: {
      float f;
      memcpy(&f, p, 4);
      if (!isfinite(f)) *special = 1;
      return f;
    }
    case 8: {
      double d;
      memcpy(&d, p, 8);
      if (!isfinite(d)) *special = 1;
      return d;
    }
    case 6:
    case 9: {
      uint16_t b;
      memcpy(&b, p, 2);
      return fdecode(small_fmt(t), b, special);
    }
    default: return fdecode(small_fmt(t), p[0], special);
  }
}

static uint64_t load_bits(int t, const void* buf, size_t i) {
  const unsigned char* p = (const unsigned char*)buf + i * (size_t)g_eltsize[t];
  uint64_t v = 0;
  memcpy(&v, p, (size_t)g_eltsize[t]); /* little endian */
  return v;
}

static void store_bits(int t, void* buf, size_t i, uint64_t v) {
  memcpy((unsigned char*)buf + i * (size_t)g_eltsize[t], &v, (size_t)g_eltsize[t]);
}

/* stores a double that is exactly representable in type t */
static void store_f(int t, void* buf, size_t i, double v) {
  unsigned char* p = (unsigned char*)buf + i * (size_t)g_eltsize[t];
  switch (t) {
    case 7: {
      float f = (float)v;
      memcpy(p, &f, 4);
      break;
    }
    case 8: memcpy(p, &v, 8); break;
    case 6:
    case 9: {
      uint16_t b = (uint16_t)fencode_exact(small_fmt(t), v);
      memcpy(p, &b, 2);
      break;
    }
    default: p[0] = (unsigned char)fencode_exact(small_fmt(t), v); break;
  }
}

/* ================================================================= pseudo-random data (see also harness_common.h) */

static uint64_t hash_bytes(const void* buf, size_t len) {
  const unsigned char* p = buf;
  uint64_t h = 0x6a09e667f3bcc908ULL ^ len;
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t w;
    memcpy(&w, p + i, 8);
    h = mix64(h ^ w) + i;
  }
  for (; i < len; i++) h = mix64(h ^ p[i]) + i;
  return h;
}

enum { MODE_EXACT = 0, MODE_TOL = 1 };

/* Element i of rank r's input for a case (seed = seed_of(rank, case, ...)). Values are chosen so
 * that MODE_EXACT reductions are exact in every order for up to 8 ranks: integer types are random
 * bits (wrap-around is exact); float sums add small integers; float products multiply +-2^k;
 * max/min compare random finite nonzero values. MODE_TOL (float types, sum and prod): random
 * mantissas, magnitudes in [2^-6, 1) (sum) or [0.5, 2) (prod); checked within a bound. */
static void gen_elem(int t, int op, int mode, uint64_t seed, size_t i, void* buf) {
  uint64_t x = pat_word(seed, i);
  if (!is_float(t)) {
    store_bits(t, buf, i, x);
    return;
  }
  const ffmt_t* f = small_fmt(t);
  if (mode == MODE_TOL) {
    int M = mant_bits(t);
    int s = (int)(x & 1);
    int e = op == ncclProd ? -(int)((x >> 1) & 1) : -1 - (int)((x >> 1) % 6);
    uint64_t m = (x >> 8) & ((M >= 52) ? ((1ULL << 52) - 1) : ((1ULL << M) - 1));
    double v = ldexp(1.0 + ldexp((double)m, -M), e);
    store_f(t, buf, i, s ? -v : v);
    return;
  }
  switch (op) {
    case ncclSum: {
      int A = t == 7 || t == 8 ? 1000 : t == 6 ? 64 : t == 9 ? 16 : t == 10 ? 2 : 1;
      store_f(t, buf, i, (double)((int64_t)(x % (uint64_t)(2 * A + 1)) - A));
      break;
    }
    case ncclProd: {
      int K = t == 7 || t == 8 ? 4 : t == 9 ? 3 : 1;
      int k = (int)((x >> 1) % (uint64_t)(2 * K + 1)) - K;
      double v = ldexp(1.0, k);
      store_f(t, buf, i, (x & 1) ? -v : v);
      break;
    }
    default: { /* max / min: random finite nonzero values */
      if (f == NULL) {
        int64_t v = (int64_t)(x % 2000001ULL) - 1000000;
        if (v == 0) v = 1;
        store_f(t, buf, i, (double)v / 1024.0);
      } else {
        unsigned nb = 1u + (unsigned)(f->E + f->M);
        for (;;) {
          unsigned b = (unsigned)(x & ((1u << nb) - 1));
          int sp;
          fdecode(f, b, &sp);
          if (!sp && (b & ((1u << (nb - 1)) - 1)) != 0) {
            if (nb == 16) {
              uint16_t h = (uint16_t)b;
              memcpy((unsigned char*)buf + i * 2, &h, 2);
            } else {
              ((unsigned char*)buf)[i] = (unsigned char)b;
            }
            break;
          }
          x = mix64(x + 0x5bd1e995ULL);
        }
      }
      break;
    }
  }
}

static void gen_buf(int t, int op, int mode, uint64_t seed, size_t count, void* buf) {
  for (size_t i = 0; i < count; i++) gen_elem(t, op, mode, seed, i, buf);
}

static uint64_t int_combine(int t, int op, uint64_t a, uint64_t b) {
  int bits = g_eltsize[t] * 8;
  uint64_t mask = bits == 64 ? ~0ULL : ((1ULL << bits) - 1);
  a &= mask;
  b &= mask;
  switch (op) {
    case ncclSum: return (a + b) & mask;
    case ncclProd: return (a * b) & mask;
    default: {
      int less;
      if (is_signed_int(t)) {
        int64_t sa = (int64_t)(a << (64 - bits)) >> (64 - bits), sb = (int64_t)(b << (64 - bits)) >> (64 - bits);
        less = sa < sb;
      } else {
        less = a < b;
      }
      if (op == ncclMax) return less ? b : a;
      return less ? a : b;
    }
  }
}

static double f_combine(int op, double a, double b) {
  switch (op) {
    case ncclSum: return a + b;
    case ncclProd: return a * b;
    case ncclMax: return a > b ? a : b;
    default: return a < b ? a : b;
  }
}

/* Checks res[0..count) against the reduction over `nranks` inputs generated from seeds[]. `ins`
 * is scratch of nranks * count * eltsize bytes (inputs are generated into it). Returns the number
 * of wrong elements; describes the first in `msg`. */
static size_t check_reduction(int t, int op, int mode, int nranks, const uint64_t* seeds, size_t count,
                              const void* res, unsigned char* ins, char* msg, size_t mlen) {
  size_t es = (size_t)g_eltsize[t], bad = 0;
  for (int r = 0; r < nranks; r++) gen_buf(t, op, mode, seeds[r], count, ins + (size_t)r * count * es);
  double maxerr = 0;
  for (size_t i = 0; i < count; i++) {
    if (!is_float(t)) {
      uint64_t acc = load_bits(t, ins, i);
      for (int r = 1; r < nranks; r++) acc = int_combine(t, op, acc, load_bits(t, ins + (size_t)r * count * es, i));
      uint64_t got = load_bits(t, res, i);
      uint64_t mask = es == 8 ? ~0ULL : ((1ULL << (8 * es)) - 1);
      if ((got & mask) != (acc & mask)) {
        if (!bad)
          snprintf(msg, mlen, "element %zu: got 0x%" PRIx64 " expected 0x%" PRIx64, i, got & mask, acc & mask);
        bad++;
      }
      continue;
    }
    int sp;
    double acc = load_f(t, ins, i, &sp), sabs = fabs(acc);
    for (int r = 1; r < nranks; r++) {
      double v = load_f(t, ins + (size_t)r * count * es, i, &sp);
      acc = f_combine(op, acc, v);
      sabs += fabs(v);
    }
    double got = load_f(t, res, i, &sp);
    int ok;
    if (sp) {
      ok = 0;
    } else if (mode == MODE_EXACT) {
      ok = got == acc;
    } else {
      double ulp = ldexp(1.0, -mant_bits(t));
      double tol = (op == ncclProd ? fabs(acc) : sabs) * ulp * nranks + min_sub(t) * nranks;
      double err = fabs(got - acc);
      if (err > maxerr) maxerr = err;
      ok = err <= tol;
    }
    if (!ok) {
      if (!bad)
        snprintf(msg, mlen, "element %zu: got %.9g expected %.9g%s", i, got, acc,
                 mode == MODE_TOL ? " (beyond the tolerance)" : " (exact)");
      bad++;
    }
  }
  return bad;
}

/* ================================================================= shared memory and ranks */

struct shm {
  hc_board_t b; /* first: abort, barriers, stage/fail/detail, kill progress (harness_run.h) */
  atomic_llong closed_ns[MAXR];
  atomic_int kerr[MAXR];      /* kill: the survivor's error code */
  atomic_llong kms_x10[MAXR]; /* kill: its delay after the SIGKILL, in 0.1 ms */
  atomic_llong kdone[MAXR];   /* kill: collectives completed before the kill */
  atomic_uint hseq[MAXR];
  unsigned char handle[MAXR][HSIZE];
  atomic_int ncase[MAXR];
  uint64_t hash[MAXR][MAXCASE];
  double bench_us[MAXR][MAXSIZES];
  int bench_bad[MAXR][MAXSIZES];
};
_Static_assert(MAXR <= HC_MAXR, "the runner forks at most HC_MAXR ranks");

typedef struct rctx {
  hc_rank_t hc; /* scenario, rank, ranks, deadline, barrier phase, aborted (harness_run.h) */
  struct shm* shm;
  void* dl;
  cn_t cn;
  net_props_t props;
  int ndev;
  void* cc;
  unsigned gen; /* handle-exchange generation */
} rctx_t;

static const char* rstr(ncclResult_t r) { return nccl_result_str((int)r); }

/* page-aligned, zeroed, with GUARD canary bytes before and after [p, p+size) */
typedef struct {
  unsigned char* base;
  unsigned char* p;
  size_t size, alloc;
} gbuf_t;

static int gbuf_alloc(rctx_t* c, gbuf_t* b, size_t size, const char* what) {
  memset(b, 0, sizeof *b);
  b->size = size;
  b->alloc = (size + 2 * GUARD + 4095) & ~(size_t)4095;
  b->base = aligned_alloc(4096, b->alloc);
  if (!b->base) return failf(c, "out of memory allocating %zu bytes for %s", size, what);
  memset(b->base, CANARY, b->alloc);
  b->p = b->base + GUARD;
  return 0;
}
static void gbuf_free(gbuf_t* b) {
  free(b->base);
  b->base = b->p = NULL;
}
/* resets the canaries around [p+off, p+off+len) and fills that range with `fill` */
static void gbuf_arm(gbuf_t* b, size_t off, size_t len, int fill) {
  memset(b->base, CANARY, GUARD + off);
  memset(b->p + off, fill, len);
  memset(b->p + off + len, CANARY, b->alloc - GUARD - off - len);
}
/* first changed canary byte outside [p+off, p+off+len), or -1 */
static long gbuf_guard_bad(const gbuf_t* b, size_t off, size_t len) {
  size_t lo = GUARD + off, hi = GUARD + off + len, end = GUARD + b->size + GUARD;
  for (size_t i = 0; i < lo; i++)
    if (b->base[i] != CANARY) return (long)i - GUARD;
  for (size_t i = hi; i < end; i++)
    if (b->base[i] != CANARY) return (long)i - GUARD;
  return -1;
}

/* ---------------------------------------------------------------- setup: open, init, connect */

static int check_props(rctx_t* c, int v, int dev, const unsigned char* buf, size_t bufsz, net_props_t* out) {
  size_t sz = net_props_size(v);
  for (size_t i = sz; i < bufsz; i++)
    if (buf[i] != 0xCD)
      return failf(c, "v%d getProperties(%d) wrote past sizeof(ncclNetProperties_v%d_t) = %zu (byte %zu changed)", v, dev,
                   v, sz, i);
  net_props_t p;
  net_props_decode(v, buf, &p);
  if (p.name == NULL || strnlen(p.name, 256) == 0 || strnlen(p.name, 256) >= 256)
    return failf(c, "v%d getProperties(%d): name is NULL, empty or unterminated", v, dev);
  if (!(p.ptrSupport & NCCL_PTR_HOST))
    return failf(c, "v%d getProperties(%d): ptrSupport 0x%x lacks NCCL_PTR_HOST", v, dev, p.ptrSupport);
  if (p.speed <= 0) return failf(c, "v%d getProperties(%d): speed %d <= 0", v, dev, p.speed);
  if (!(p.latency >= 0.0f) || isinf(p.latency))
    return failf(c, "v%d getProperties(%d): latency %g invalid", v, dev, (double)p.latency);
  if (p.maxComms <= 0) return failf(c, "v%d getProperties(%d): maxComms %d <= 0", v, dev, p.maxComms);
  if (v >= 7 && (p.netDeviceType != NCCL_NET_DEVICE_HOST || p.netDeviceVersion != 0))
    return failf(c, "v%d getProperties(%d): netDeviceType %d / version %d, expected HOST (0) / 0", v, dev,
                 p.netDeviceType, p.netDeviceVersion);
  if (v >= 8 && p.regIsGlobal != 0 && p.regIsGlobal != 1)
    return failf(c, "v%d getProperties(%d): regIsGlobal %d not 0/1", v, dev, p.regIsGlobal);
  if (v >= 9) {
    if (p.maxCollBytes == 0 || p.maxCollBytes > NCCL_MAX_NET_SIZE_BYTES)
      return failf(c, "v%d getProperties(%d): maxCollBytes %zu not in (0, 1 TiB]", v, dev, p.maxCollBytes);
    if (p.maxP2pBytes == 0 || p.maxP2pBytes > NCCL_MAX_NET_SIZE_BYTES)
      return failf(c, "v%d getProperties(%d): maxP2pBytes %zu not in (0, 1 TiB]", v, dev, p.maxP2pBytes);
    int maxv = v >= 12 ? NCCL_NET_MAX_DEVS_PER_NIC_V12 : NCCL_NET_MAX_DEVS_PER_NIC_V9;
    if (p.vndevs < 0 || p.vndevs > maxv)
      return failf(c, "v%d getProperties(%d): vProps.ndevs %d not in [0, %d]", v, dev, p.vndevs, maxv);
  }
  if (v >= 11 && p.maxMultiRequestSize < 1)
    return failf(c, "v%d getProperties(%d): maxMultiRequestSize %d < 1", v, dev, p.maxMultiRequestSize);
  if (out) *out = p;
  return 0;
}

static int open_lib(rctx_t* c) {
  if (c->dl) return 0;
  stagef(c, "dlopen %s", g_lib);
  dlerror();
  c->dl = dlopen(g_lib, RTLD_NOW | RTLD_LOCAL);
  if (!c->dl) {
    const char* e = dlerror();
    return failf(c, "dlopen(%s) failed: %s", g_lib, e ? e : "?");
  }
  /* every version must resolve (NCCL picks the newest it knows) */
  for (int v = NET_MIN_VERSION; v <= NET_MAX_VERSION; v++) {
    cn_t t;
    char err[256];
    if (cn_bind(&t, c->dl, v, err, sizeof err) != 0) return failf(c, "%s", err);
  }
  return 0;
}

/* Handles all-gather through the mapping: returns all nranks handles in rank order. */
static int exchange_handles(rctx_t* c, const unsigned char* mine, unsigned char (*all)[HSIZE]) {
  unsigned gen = ++c->gen;
  memcpy(c->shm->handle[c->hc.rank], mine, HSIZE);
  atomic_store_explicit(&c->shm->hseq[c->hc.rank], gen, memory_order_release);
  stagef(c, "waiting for the handles of generation %u", gen);
  int64_t deadline = op_deadline(c);
  int spins = 0;
  for (int r = 0; r < c->hc.nranks; r++) {
    while (atomic_load_explicit(&c->shm->hseq[r], memory_order_acquire) < gen) {
      if (check_abort(c)) return -1;
      if (now_ns() > deadline) return failf(c, "timed out waiting for rank %d's handle (generation %u)", r, gen);
      backoff(&spins);
    }
    memcpy(all[r], c->shm->handle[r], HSIZE);
  }
  /* nobody overwrites its slot (next generation) before everybody has read this one */
  return sync_ranks(c, "handles read");
}

/* listen + all-gather + connect (one call) + closeListen, on table c->cn (already initialised). */
static int cn_connect_all(rctx_t* c, int dev, void** ccout, double* connect_ms) {
  unsigned char buf[HSIZE + 64];
  memset(buf, 0xEE, sizeof buf);
  void* lc = NULL;
  stagef(c, "v%d listen(dev %d)", c->cn.version, dev);
  ncclResult_t r = cn_listen(&c->cn, dev, buf, &lc);
  if (r != ncclSuccess) return failf(c, "v%d listen(dev %d) returned %d (%s)", c->cn.version, dev, r, rstr(r));
  if (lc == NULL) return failf(c, "v%d listen returned ncclSuccess with a NULL listenComm", c->cn.version);
  for (int i = HSIZE; i < (int)sizeof buf; i++)
    if (buf[i] != 0xEE) return failf(c, "v%d listen wrote past the 128-byte handle (byte %d changed)", c->cn.version, i);
  unsigned char all[MAXR][HSIZE];
  if (exchange_handles(c, buf, all)) return -1;
  void* handles[MAXR];
  for (int i = 0; i < c->hc.nranks; i++) handles[i] = all[i];
  void* cc = NULL;
  stagef(c, "v%d connect(handles[%d], rank %d) (one call)", c->cn.version, c->hc.nranks, c->hc.rank);
  int64_t t0 = now_ns();
  r = cn_connect(&c->cn, handles, c->hc.nranks, c->hc.rank, lc, &cc);
  double ms = ms_since(t0);
  if (connect_ms) *connect_ms = ms;
  if (r != ncclSuccess)
    return failf(c, "v%d connect(nranks %d, rank %d) returned %d (%s) after %.0f ms", c->cn.version, c->hc.nranks, c->hc.rank,
                 r, rstr(r), ms);
  if (cc == NULL)
    return failf(c, "v%d connect returned ncclSuccess with a NULL collComm after %.0f ms (NCCL calls connect once: "
                 "CollNet would be disabled)", c->cn.version, ms);
  stagef(c, "v%d closeListen", c->cn.version);
  r = cn_close_listen(&c->cn, lc);
  if (r != ncclSuccess) return failf(c, "v%d closeListen after connect returned %d (%s)", c->cn.version, r, rstr(r));
  *ccout = cc;
  return 0;
}

/* init + devices + getProperties(each, canary) on table version v. */
static int cn_init_checked(rctx_t* c, int v, uint64_t commId) {
  char err[256];
  if (cn_bind(&c->cn, c->dl, v, err, sizeof err) != 0) return failf(c, "%s", err);
  stagef(c, "v%d init", v);
  ncclResult_t r = cn_init(&c->cn, commId);
  if (r != ncclSuccess) return failf(c, "%s init returned %d (%s)", cn_symbol_name(v), r, rstr(r));
  r = cn_devices(&c->cn, &c->ndev);
  if (r != ncclSuccess) return failf(c, "v%d devices returned %d (%s)", v, r, rstr(r));
  if (c->ndev < 1) return failf(c, "v%d devices reported %d devices (CollNet would be disabled)", v, c->ndev);
  for (int dev = 0; dev < c->ndev && dev < 4; dev++) {
    _Alignas(16) unsigned char buf[512];
    memset(buf, 0xCD, sizeof buf);
    stagef(c, "v%d getProperties(%d)", v, dev);
    r = cn_get_props_raw(&c->cn, dev, buf);
    if (r != ncclSuccess) return failf(c, "v%d getProperties(%d) returned %d (%s)", v, dev, r, rstr(r));
    if (check_props(c, v, dev, buf, sizeof buf, dev == 0 ? &c->props : NULL)) return -1;
  }
  return 0;
}

static uint64_t comm_id(rctx_t* c) { return 0xC011AE70000ULL + (uint64_t)c->hc.nranks * 16 + (uint64_t)c->gen; }

static int std_setup(rctx_t* c) {
  if (open_lib(c)) return -1;
  if (cn_init_checked(c, g_version, comm_id(c))) return -1;
  return cn_connect_all(c, 0, &c->cc, NULL);
}

static int std_teardown(rctx_t* c) {
  if (c->cc) {
    stagef(c, "closeColl");
    ncclResult_t r = cn_close_coll(&c->cn, c->cc);
    c->cc = NULL;
    if (r != ncclSuccess) return failf(c, "closeColl returned %d (%s)", r, rstr(r));
  }
  stagef(c, "finalize");
  ncclResult_t r = cn_finalize(&c->cn);
  if (r != ncclSuccess) return failf(c, "finalize returned %d (%s)", r, rstr(r));
  if (atomic_load(&cn_logger_bad_calls))
    return failf(c, "the plugin called the logger %ld times with a NULL format or a bad level",
                 (long)atomic_load(&cn_logger_bad_calls));
  return 0;
}

static int regmr(rctx_t* c, void* data, size_t size, void** mh, const char* what) {
  stagef(c, "regMr(%s, %zu B)", what, size);
  *mh = NULL;
  ncclResult_t r = cn_regmr(&c->cn, c->cc, data, size, NCCL_PTR_HOST, mh);
  if (r != ncclSuccess) return failf(c, "regMr(%s, %zu B, NCCL_PTR_HOST) returned %d (%s)", what, size, r, rstr(r));
  if (*mh == NULL) return failf(c, "regMr(%s) returned ncclSuccess with a NULL mhandle", what);
  return 0;
}

static int deregmr(rctx_t* c, void* mh, const char* what) {
  if (!mh) return 0;
  ncclResult_t r = cn_deregmr(&c->cn, c->cc, mh);
  if (r != ncclSuccess) return failf(c, "deregMr(%s) returned %d (%s)", what, r, rstr(r));
  return 0;
}

/* ---------------------------------------------------------------- operations */

enum { K_AR = 0, K_AG = 1, K_RS = 2 };

typedef struct {
  int kind;
  void* send;
  void* recv;
  size_t count; /* allreduce */
  int dt, op;
  void* smh;
  void* rmh;
  cn_sge_t part; /* allgather: recvParts[0]; reducescatter: sendParts[0] */
  size_t bpr, off, wb;
  cn_t* cn; /* NULL: the rank's table and collComm (c->cn, c->cc) */
  void* cc;
  /* state */
  void* req;
  int posted, done, size, nulls;
  char what[160];
} cop_t;

static ncclResult_t cop_post_once(rctx_t* c, cop_t* o, void** req) {
  cn_t* n = o->cn ? o->cn : &c->cn;
  void* cc = o->cn ? o->cc : c->cc;
  switch (o->kind) {
    case K_AR: return cn_iallreduce(n, cc, o->send, o->recv, o->count, o->dt, o->op, o->smh, o->rmh, req);
    case K_AG: return cn_iallgather(n, cc, o->send, 1, &o->part, o->bpr, o->off, o->wb, o->smh, req);
    default: return cn_ireducescatter(n, cc, 1, &o->part, o->recv, o->bpr, o->off, o->wb, o->dt, o->op, o->rmh, req);
  }
}

static int cop_poll(rctx_t* c, cop_t* o) {
  if (!o->posted || o->done) return 0;
  int done = 0, size = -1;
  ncclResult_t r = cn_test(o->cn ? o->cn : &c->cn, o->req, &done, &size);
  if (r != ncclSuccess) return failf(c, "%s: test() returned %d (%s)", o->what, r, rstr(r));
  if (done) {
    o->done = 1;
    o->size = size;
  }
  return 0;
}

/* posts, retrying a NULL request ("would block") while testing `others` */
static int cop_post(rctx_t* c, cop_t* o, cop_t** others, int nothers) {
  o->req = NULL;
  o->posted = o->done = 0;
  o->size = -1;
  int64_t deadline = op_deadline(c), t0 = now_ns();
  int spins = 0;
  stagef(c, "post %s", o->what);
  for (;;) {
    void* req = NULL;
    ncclResult_t r = cop_post_once(c, o, &req);
    if (r != ncclSuccess) return failf(c, "%s: post returned %d (%s)", o->what, r, rstr(r));
    if (req) {
      o->req = req;
      o->posted = 1;
      return 0;
    }
    o->nulls++;
    for (int i = 0; i < nothers; i++)
      if (cop_poll(c, others[i])) return -1;
    if (check_abort(c)) return -1;
    if (now_ns() > deadline) return failf(c, "%s: kept returning a NULL request for %.0f ms", o->what, ms_since(t0));
    backoff(&spins);
  }
}

static int cop_wait(rctx_t* c, cop_t** ops, int n) {
  int64_t deadline = op_deadline(c), t0 = now_ns();
  int spins = 0;
  stagef(c, "waiting for %d request(s), first %s", n, ops[0]->what);
  for (;;) {
    int left = 0;
    for (int i = 0; i < n; i++) {
      if (cop_poll(c, ops[i])) return -1;
      if (!ops[i]->done) left++;
    }
    if (!left) return 0;
    if (check_abort(c)) return -1;
    if (now_ns() > deadline) {
      for (int i = 0; i < n; i++)
        if (!ops[i]->done)
          return failf(c, "%s: not done after %.0f ms of test() polling (%d of %d requests pending)", ops[i]->what,
                       ms_since(t0), left, n);
    }
    backoff(&spins);
  }
}

static int cop_run(rctx_t* c, cop_t* o) {
  if (cop_post(c, o, NULL, 0)) return -1;
  cop_t* ops[1] = {o};
  return cop_wait(c, ops, 1);
}

/* ================================================================= scenarios */

/* ---------------------------------------------------------------- symbols */

static int scn_symbols(rctx_t* c) {
  if (open_lib(c)) return -1;
  char notes[DETAIL_LEN] = "";
  for (int v = NET_MIN_VERSION; v <= NET_MAX_VERSION; v++) {
    cn_t t;
    char err[256], nulls[256], opt[256];
    if (cn_bind(&t, c->dl, v, err, sizeof err) != 0) return failf(c, "%s", err);
    /* the table is a data symbol of exactly the struct's size */
    Dl_info info;
    const ElfW(Sym)* sym = NULL;
    if (dladdr1(t.table, &info, (void**)&sym, RTLD_DL_SYMENT) && sym) {
      if (ELF64_ST_TYPE(sym->st_info) != STT_OBJECT)
        return failf(c, "%s is not a data symbol (ELF type %d)", cn_symbol_name(v), (int)ELF64_ST_TYPE(sym->st_info));
      if (sym->st_size != 0 && sym->st_size != cn_table_size(v))
        return failf(c, "%s: ELF symbol size %zu, sizeof(ncclCollNet_v%d_t) is %zu", cn_symbol_name(v),
                     (size_t)sym->st_size, v, cn_table_size(v));
    }
    const char* name = *(const char* const*)t.table;
    if (name == NULL || strnlen(name, 64) == 0 || strnlen(name, 64) >= 64)
      return failf(c, "%s.name is NULL, empty or unterminated", cn_symbol_name(v));
    if (cn_null_members(&t, nulls, sizeof nulls, opt, sizeof opt))
      return failf(c, "%s: NULL members: %s", cn_symbol_name(v), nulls);
    if (opt[0] && v == NET_MAX_VERSION)
      snprintf(notes + strlen(notes), sizeof notes - strlen(notes), "v%d NULL (optional): %s; ", v, opt);
    if (v == NET_MAX_VERSION)
      snprintf(notes + strlen(notes), sizeof notes - strlen(notes), "name \"%s\"; ", name);
    /* init / devices / getProperties / finalize through this version's table */
    if (cn_init_checked(c, v, 0xC0115ULL + (uint64_t)v)) return -1;
    if (v == NET_MAX_VERSION)
      snprintf(notes + strlen(notes), sizeof notes - strlen(notes), "%d dev(s), dev0 \"%s\" speed %d maxCollBytes %zu; ",
               c->ndev, c->props.name, c->props.speed, c->props.maxCollBytes);
    ncclResult_t r = cn_finalize(&c->cn);
    if (r != ncclSuccess) return failf(c, "v%d finalize returned %d (%s)", v, r, rstr(r));
  }
  /* and a real connect through the selected version */
  if (cn_init_checked(c, g_version, comm_id(c))) return -1;
  double ms = 0;
  if (cn_connect_all(c, 0, &c->cc, &ms)) return -1;
  if (std_teardown(c)) return -1;
  if (c->hc.rank == 0) detailf(c, "%sv%d connect %.0f ms", notes, g_version, ms);
  return 0;
}

/* ---------------------------------------------------------------- support */

static int scn_support(rctx_t* c) {
  if (std_setup(c)) return -1;
  int m[12][4];
  char bad[512] = "";
  for (int t = 0; t < 12; t++)
    for (int o = 0; o < 4; o++) {
      int s = -7;
      ncclResult_t r = cn_reduce_support(&c->cn, t, o, &s);
      m[t][o] = r != ncclSuccess ? -100 - (int)r : s;
      if (r != ncclSuccess || s != 1)
        snprintf(bad + strlen(bad), sizeof bad - strlen(bad), " %s/%s=%s%d", tname(t), oname(o),
                 r != ncclSuccess ? "err" : "", r != ncclSuccess ? (int)r : s);
    }
  /* beyond the matrix NCCL asks about: must not claim support (0) or return an error */
  struct {
    int t, o;
  } extra[] = {{7, 4}, {2, 4}, {7, 5}, {0, 9}, {12, 0}, {13, 2}, {7, 100}, {100, 0}};
  char ext[512] = "";
  for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
    int s = -7;
    ncclResult_t r = cn_reduce_support(&c->cn, extra[i].t, extra[i].o, &s);
    snprintf(ext + strlen(ext), sizeof ext - strlen(ext), " (type %d, op %d)=%s%d", extra[i].t, extra[i].o,
             r != ncclSuccess ? "err " : "", r != ncclSuccess ? (int)r : s);
    if (r == ncclSuccess && s != 0)
      snprintf(bad + strlen(bad), sizeof bad - strlen(bad), " (type %d, op %d) supported=%d (expected 0 or an error)",
               extra[i].t, extra[i].o, s);
  }
  if (c->hc.rank == 0 && g_print_matrix) {
    printf("  reduceSupport matrix (v%d; 1 = supported, 0 = not, eN = error N):\n  %6s", g_version, "");
    for (int o = 0; o < 4; o++) printf(" %5s", oname(o));
    printf("\n");
    for (int t = 0; t < 12; t++) {
      printf("  %6s", tname(t));
      for (int o = 0; o < 4; o++) {
        if (m[t][o] <= -100) printf("    e%d", -(m[t][o] + 100));
        else printf(" %5d", m[t][o]);
      }
      printf("\n");
    }
    printf("  beyond:%s\n", ext);
    fflush(stdout);
  }
  if (bad[0]) return failf(c, "reduceSupport:%s", bad);

  /* registration: regMr/deregMr of a host buffer, regMrDmaBuf must fail */
  gbuf_t b = {0};
  if (gbuf_alloc(c, &b, MIB, "regmr buffer")) return -1;
  void* mh = NULL;
  if (regmr(c, b.p, MIB, &mh, "1 MiB host buffer") || deregmr(c, mh, "1 MiB host buffer")) return -1;
  void* mh2 = NULL;
  if (regmr(c, b.p + 4096, 8192, &mh, "sub-range a") || regmr(c, b.p + 4096, 8192, &mh2, "sub-range b (same range)"))
    return -1;
  if (deregmr(c, mh, "sub-range a") || deregmr(c, mh2, "sub-range b")) return -1;
  int fd = open("/dev/null", O_RDONLY);
  void* dmh = NULL;
  stagef(c, "regMrDmaBuf");
  ncclResult_t dr = cn_regmr_dmabuf(&c->cn, c->cc, b.p, MIB, NCCL_PTR_CUDA, 0, fd, &dmh);
  if (fd >= 0) close(fd);
  if (dr == ncclSuccess) return failf(c, "regMrDmaBuf(NCCL_PTR_CUDA, fd of /dev/null) returned ncclSuccess (mhandle %p)", dmh);
  /* iflush: NCCL calls it only for GDR; report what it does */
  void* freq = (void*)0x1;
  ncclResult_t r = cn_iflush(&c->cn, c->cc, b.p, 4096, NULL, &freq);
  char fl[96];
  snprintf(fl, sizeof fl, "iflush: %d (%s), request %s", r, rstr(r), freq == NULL ? "NULL" : freq == (void*)0x1 ? "unwritten" : "set");
  if (r == ncclSuccess && freq != NULL && freq != (void*)0x1) {
    int done = 0, s = 0;
    int64_t dl = op_deadline(c);
    int spins = 0;
    while (!done) {
      ncclResult_t tr = cn_test(&c->cn, freq, &done, &s);
      if (tr != ncclSuccess) return failf(c, "test() of an iflush request returned %d (%s)", tr, rstr(tr));
      if (now_ns() > dl) return failf(c, "iflush request never completed");
      backoff(&spins);
    }
  }
  gbuf_free(&b);
  if (sync_ranks(c, "support done")) return -1;
  if (std_teardown(c)) return -1;
  if (c->hc.rank == 0) detailf(c, "12x4 all supported; regMrDmaBuf -> %d (%s); %s", dr, rstr(dr), fl);
  return 0;
}

/* ---------------------------------------------------------------- allreduce */

typedef struct {
  int dt, op, mode, inplace;
  size_t count;
} arcase_t;

static int build_ar_cases(arcase_t* cs, int max) {
  int n = 0;
  static const size_t counts[] = {1, 1000, 65537};
  for (int t = 0; t < 12; t++)
    for (int o = 0; o < 4; o++)
      for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
        if (n < max) cs[n++] = (arcase_t){t, o, MODE_EXACT, 0, counts[k]};
  static const int big[][2] = {{7, 0}, {9, 0}, {2, 2}, {8, 3}, {11, 1}, {4, 1}};
  for (size_t k = 0; k < sizeof big / sizeof big[0]; k++)
    if (n < max) cs[n++] = (arcase_t){big[k][0], big[k][1], MODE_EXACT, 0, (size_t)1 << 20};
  static const int ft[] = {6, 7, 8, 9, 10, 11};
  for (size_t k = 0; k < sizeof ft / sizeof ft[0]; k++)
    for (int o = 0; o < 2; o++)
      if (n < max) cs[n++] = (arcase_t){ft[k], o, MODE_TOL, 0, 4099};
  static const int inpl[][2] = {{7, 0}, {2, 1}, {10, 2}, {0, 3}};
  for (size_t k = 0; k < sizeof inpl / sizeof inpl[0]; k++)
    if (n < max) cs[n++] = (arcase_t){inpl[k][0], inpl[k][1], MODE_EXACT, 1, k % 2 ? 65537 : 1000};
  return n;
}

static void case_desc(const arcase_t* k, char* out, size_t len) {
  snprintf(out, len, "iallreduce(%s %s count %zu%s%s)", tname(k->dt), oname(k->op), k->count,
           k->mode == MODE_TOL ? ", random mantissas" : "", k->inplace ? ", in place" : "");
}

/* compares every rank's published result hashes (rank 0 does it, after a barrier) */
static int compare_hashes(rctx_t* c, int ncase, void (*desc)(int, char*, size_t, const void*), const void* arg) {
  if (sync_ranks(c, "hashes published")) return -1;
  if (c->hc.rank != 0) return 0;
  for (int r = 1; r < c->hc.nranks; r++) {
    if (atomic_load(&c->shm->ncase[r]) != ncase)
      return failf(c, "rank %d published %d results, rank 0 %d", r, atomic_load(&c->shm->ncase[r]), ncase);
    for (int i = 0; i < ncase; i++)
      if (c->shm->hash[r][i] != c->shm->hash[0][i]) {
        char d[160];
        desc(i, d, sizeof d, arg);
        return failf(c, "%s: rank %d's result differs from rank 0's (results must be bit-identical on every rank)", d, r);
      }
  }
  return 0;
}

static void ar_desc(int i, char* out, size_t len, const void* arg) { case_desc((const arcase_t*)arg + i, out, len); }

static int scn_allreduce(rctx_t* c) {
  if (std_setup(c)) return -1;
  static arcase_t cs[MAXCASE];
  int ncase = build_ar_cases(cs, MAXCASE);
  size_t maxb = 0;
  for (int i = 0; i < ncase; i++)
    if (cs[i].count * (size_t)g_eltsize[cs[i].dt] > maxb) maxb = cs[i].count * (size_t)g_eltsize[cs[i].dt];
  gbuf_t sb = {0}, rb = {0};
  if (gbuf_alloc(c, &sb, maxb, "send") || gbuf_alloc(c, &rb, maxb, "recv")) return -1;
  unsigned char* scratch = malloc(maxb * (size_t)c->hc.nranks);
  if (!scratch) return failf(c, "out of memory (reference scratch)");
  void *smh, *rmh;
  if (regmr(c, sb.p, maxb, &smh, "send buffer") || regmr(c, rb.p, maxb, &rmh, "recv buffer")) return -1;
  int nulls = 0;
  double t_total = 0;
  for (int i = 0; i < ncase; i++) {
    const arcase_t* k = &cs[i];
    size_t es = (size_t)g_eltsize[k->dt], bytes = k->count * es;
    uint64_t seeds[MAXR] = {0};
    for (int r = 0; r < c->hc.nranks; r++) seeds[r] = seed_of((uint64_t)r, (uint64_t)i, (uint64_t)k->dt * 16 + (uint64_t)k->op);
    cop_t o;
    memset(&o, 0, sizeof o);
    case_desc(k, o.what, sizeof o.what);
    o.kind = K_AR;
    o.count = k->count;
    o.dt = k->dt;
    o.op = k->op;
    if (k->inplace) {
      gbuf_arm(&rb, 0, bytes, 0);
      gen_buf(k->dt, k->op, k->mode, seeds[c->hc.rank], k->count, rb.p);
      o.send = o.recv = rb.p;
      o.smh = o.rmh = rmh;
    } else {
      gbuf_arm(&sb, 0, bytes, 0);
      gen_buf(k->dt, k->op, k->mode, seeds[c->hc.rank], k->count, sb.p);
      gbuf_arm(&rb, 0, bytes, 0x5A); /* stale bytes that are not a plausible result */
      o.send = sb.p;
      o.recv = rb.p;
      o.smh = smh;
      o.rmh = rmh;
    }
    int64_t t0 = now_ns();
    if (cop_run(c, &o)) return -1;
    t_total += ms_since(t0);
    nulls += o.nulls;
    if (o.size != (int)bytes) return failf(c, "%s: test() reported size %d, expected %zu bytes", o.what, o.size, bytes);
    long g = gbuf_guard_bad(&rb, 0, bytes);
    if (g >= 0) return failf(c, "%s: recv buffer written outside [0, %zu): byte offset %ld", o.what, bytes, g);
    if (!k->inplace) {
      g = gbuf_guard_bad(&sb, 0, bytes);
      if (g >= 0) return failf(c, "%s: send buffer's guard changed at offset %ld", o.what, g);
      /* the send buffer must be unchanged */
      gen_buf(k->dt, k->op, k->mode, seeds[c->hc.rank], k->count, scratch);
      if (memcmp(scratch, sb.p, bytes) != 0) return failf(c, "%s: the plugin modified the send buffer", o.what);
    }
    char msg[256] = "";
    size_t bad = check_reduction(k->dt, k->op, k->mode, c->hc.nranks, seeds, k->count, rb.p, scratch, msg, sizeof msg);
    if (bad) return failf(c, "%s: %zu of %zu elements wrong; first: %s", o.what, bad, k->count, msg);
    c->shm->hash[c->hc.rank][i] = hash_bytes(rb.p, bytes);
  }
  atomic_store(&c->shm->ncase[c->hc.rank], ncase);
  if (compare_hashes(c, ncase, ar_desc, cs)) return -1;
  if (deregmr(c, smh, "send") || deregmr(c, rmh, "recv")) return -1;
  gbuf_free(&sb);
  gbuf_free(&rb);
  free(scratch);
  if (std_teardown(c)) return -1;
  if (c->hc.rank == 0)
    detailf(c, "%d cases (12 types x 4 ops x counts 1/1000/65537, 6 x 1Mi elements, 12 random-mantissa, 4 in place), "
            "exact and bit-identical on all ranks; %.0f ms in collectives; %d NULL requests",
            ncase, t_total, nulls);
  return 0;
}

/* ---------------------------------------------------------------- allgather */

typedef struct {
  size_t bpr;
} agdesc_t;

/* window sizes for a buffer of `total` bytes: the whole, then ~0.7 x bpr, then ~1.6 x bpr (both
 * rounded to `unit` and not multiples of bpr where bpr > unit) */
static int window_sizes(size_t bpr, size_t total, size_t unit, size_t* ws) {
  int n = 0;
  ws[n++] = total;
  size_t a = (bpr * 7 / 10 / unit) * unit + unit;
  size_t b = (bpr * 16 / 10 / unit) * unit + unit;
  if (a % bpr == 0 && a + unit < total) a += unit;
  if (b % bpr == 0) b += unit;
  ws[n++] = a < total ? a : total;
  ws[n++] = b < total ? b : total;
  return n;
}

static int scn_allgather(rctx_t* c) {
  if (std_setup(c)) return -1;
  static const size_t bprs[] = {1, 4099, 1u << 20};
  int ncalls = 0;
  double t_total = 0;
  for (size_t bi = 0; bi < sizeof bprs / sizeof bprs[0]; bi++) {
    size_t bpr = bprs[bi], total = bpr * (size_t)c->hc.nranks;
    gbuf_t sb = {0}, rb = {0};
    if (gbuf_alloc(c, &sb, bpr, "own slice") || gbuf_alloc(c, &rb, total, "window")) return -1;
    uint64_t seeds[MAXR] = {0};
    for (int r = 0; r < c->hc.nranks; r++) seeds[r] = seed_of((uint64_t)r, 0xA6, bpr);
    pat_fill(sb.p, bpr, seeds[c->hc.rank]);
    void *smh, *rmh;
    if (regmr(c, sb.p, bpr, &smh, "own slice") || regmr(c, rb.p, total, &rmh, "window buffer")) return -1;
    size_t ws[3];
    int nws = window_sizes(bpr, total, 1, ws);
    for (int wi = 0; wi < nws; wi++) {
      size_t w = ws[wi];
      for (size_t off = 0; off < total; off += w) {
        size_t wb = total - off < w ? total - off : w;
        size_t own0 = (size_t)c->hc.rank * bpr, own1 = own0 + bpr;
        size_t s = off > own0 ? off : own0;
        cop_t o;
        memset(&o, 0, sizeof o);
        o.kind = K_AG;
        o.send = (s < own1 && s < off + wb) ? sb.p + (s - own0) : sb.p; /* unused when no overlap */
        o.smh = smh;
        o.part.mhandle = rmh;
        o.part.address = rb.p;
        o.part.size = wb;
        o.bpr = bpr;
        o.off = off;
        o.wb = wb;
        snprintf(o.what, sizeof o.what, "iallgather(bytesPerRank %zu, window [%zu, +%zu) of %zu)", bpr, off, wb, total);
        gbuf_arm(&rb, 0, wb, 0x5A);
        int64_t t0 = now_ns();
        if (cop_run(c, &o)) return -1;
        t_total += ms_since(t0);
        ncalls++;
        long g = gbuf_guard_bad(&rb, 0, wb);
        if (g >= 0)
          return failf(c, "%s: recvParts[0] (%zu B) written outside its range: byte offset %ld", o.what, wb, g);
        for (size_t j = 0; j < wb; j++) {
          size_t gi = off + j;
          int owner = (int)(gi / bpr);
          uint8_t want = pat_byte(seeds[owner], gi % bpr);
          if (rb.p[j] != want)
            return failf(c, "%s: byte %zu of the window (global offset %zu, rank %d's slice offset %zu) is 0x%02x, "
                         "expected 0x%02x", o.what, j, gi, owner, gi % bpr, rb.p[j], want);
        }
        for (size_t j = 0; j < bpr; j++)
          if (sb.p[j] != pat_byte(seeds[c->hc.rank], j)) return failf(c, "%s: the send slice was modified", o.what);
        if (gbuf_guard_bad(&sb, 0, bpr) >= 0) return failf(c, "%s: the send slice's guard bytes changed", o.what);
      }
    }
    if (deregmr(c, smh, "own slice") || deregmr(c, rmh, "window buffer")) return -1;
    gbuf_free(&sb);
    gbuf_free(&rb);
  }
  if (std_teardown(c)) return -1;
  if (c->hc.rank == 0)
    detailf(c, "bytesPerRank 1/4099/1MiB x (whole, ~0.7 and ~1.6 x bpr windows): %d calls, %.0f ms", ncalls, t_total);
  return 0;
}

/* ---------------------------------------------------------------- reducescatter */

static int scn_reducescatter(rctx_t* c) {
  if (std_setup(c)) return -1;
  static const struct {
    int dt, op;
    size_t bpr_elems;
  } rs[] = {{7, 0, 1},    {7, 0, 1001}, {2, 2, 1001}, {9, 0, 4099}, {4, 1, 777},
            {10, 3, 333}, {6, 1, 1000}, {7, 0, 262144}, {1, 0, 100003}};
  int ncalls = 0;
  double t_total = 0;
  for (size_t ci = 0; ci < sizeof rs / sizeof rs[0]; ci++) {
    int dt = rs[ci].dt, op = rs[ci].op;
    size_t es = (size_t)g_eltsize[dt], bpr = rs[ci].bpr_elems * es, total = bpr * (size_t)c->hc.nranks;
    size_t ecount = rs[ci].bpr_elems * (size_t)c->hc.nranks;
    gbuf_t ib = {0}, ob = {0};
    if (gbuf_alloc(c, &ib, total, "input") || gbuf_alloc(c, &ob, bpr, "own output slice")) return -1;
    unsigned char* scratch = malloc(total * (size_t)c->hc.nranks + 16);
    unsigned char* exp = malloc(bpr + 16);
    if (!scratch || !exp) return failf(c, "out of memory");
    uint64_t seeds[MAXR] = {0};
    for (int r = 0; r < c->hc.nranks; r++) seeds[r] = seed_of((uint64_t)r, 0x25 + ci, (uint64_t)dt * 16 + (uint64_t)op);
    gen_buf(dt, op, MODE_EXACT, seeds[c->hc.rank], ecount, ib.p);
    /* expected own slice: reduce all ranks' inputs, keep [rank*bpr, +bpr) */
    {
      for (int r = 0; r < c->hc.nranks; r++) gen_buf(dt, op, MODE_EXACT, seeds[r], ecount, scratch + (size_t)r * total);
      for (size_t e = 0; e < rs[ci].bpr_elems; e++) {
        size_t gi = (size_t)c->hc.rank * rs[ci].bpr_elems + e;
        if (!is_float(dt)) {
          uint64_t acc = load_bits(dt, scratch, gi);
          for (int r = 1; r < c->hc.nranks; r++) acc = int_combine(dt, op, acc, load_bits(dt, scratch + (size_t)r * total, gi));
          store_bits(dt, exp, e, acc);
        } else {
          int sp;
          double acc = load_f(dt, scratch, gi, &sp);
          for (int r = 1; r < c->hc.nranks; r++) acc = f_combine(op, acc, load_f(dt, scratch + (size_t)r * total, gi, &sp));
          store_f(dt, exp, e, acc);
        }
      }
    }
    void *smh, *rmh;
    if (regmr(c, ib.p, total, &smh, "input") || regmr(c, ob.p, bpr, &rmh, "output slice")) return -1;
    size_t ws[3];
    int nws = window_sizes(bpr, total, es, ws);
    for (int wi = 0; wi < nws; wi++) {
      size_t w = ws[wi];
      gbuf_arm(&ob, 0, bpr, CANARY); /* the whole output slice is canary until written */
      size_t own0 = (size_t)c->hc.rank * bpr, own1 = own0 + bpr;
      for (size_t off = 0; off < total; off += w) {
        size_t wb = total - off < w ? total - off : w;
        size_t s = off > own0 ? off : own0, e = off + wb < own1 ? off + wb : own1;
        cop_t o;
        memset(&o, 0, sizeof o);
        o.kind = K_RS;
        o.part.mhandle = smh;
        o.part.address = ib.p + off;
        o.part.size = wb;
        o.recv = s < e ? ob.p + (s - own0) : ob.p; /* nothing is written when the window misses the slice */
        o.rmh = rmh;
        o.dt = dt;
        o.op = op;
        o.bpr = bpr;
        o.off = off;
        o.wb = wb;
        snprintf(o.what, sizeof o.what, "ireducescatter(%s %s, bytesPerRank %zu, window [%zu, +%zu) of %zu)", tname(dt),
                 oname(op), bpr, off, wb, total);
        int64_t t0 = now_ns();
        if (cop_run(c, &o)) return -1;
        t_total += ms_since(t0);
        ncalls++;
        /* bytes of the own slice written so far: [0, min(off+wb, own1) - own0) */
        size_t upto = off + wb <= own0 ? 0 : (off + wb >= own1 ? bpr : off + wb - own0);
        for (size_t j = upto; j < bpr; j++)
          if (ob.p[j] != CANARY)
            return failf(c, "%s: output slice byte %zu written although it lies beyond the windows so far (written "
                         "range [0, %zu))", o.what, j, upto);
        long g = gbuf_guard_bad(&ob, 0, bpr);
        if (g >= 0) return failf(c, "%s: output written outside the slice: offset %ld", o.what, g);
        if (s < e && memcmp(ob.p + (s - own0), exp + (s - own0), e - s) != 0) {
          size_t j = s - own0;
          while (j < e - own0 && ob.p[j] == exp[j]) j++;
          size_t el = j / es;
          int sp;
          if (is_float(dt))
            return failf(c, "%s: own slice element %zu (bytes [%zu, %zu) of the slice written by this window) is %.9g, "
                         "expected %.9g", o.what, el, s - own0, e - own0, load_f(dt, ob.p, el, &sp), load_f(dt, exp, el, &sp));
          return failf(c, "%s: own slice element %zu is 0x%" PRIx64 ", expected 0x%" PRIx64, o.what, el,
                       load_bits(dt, ob.p, el), load_bits(dt, exp, el));
        }
        if (memcmp(ib.p, scratch + (size_t)c->hc.rank * total, total) != 0)
          return failf(c, "%s: the plugin modified the send buffer", o.what);
      }
      if (memcmp(ob.p, exp, bpr) != 0) return failf(c, "window size %zu: the own slice is incomplete at the end", w);
    }
    if (deregmr(c, smh, "input") || deregmr(c, rmh, "output")) return -1;
    gbuf_free(&ib);
    gbuf_free(&ob);
    free(scratch);
    free(exp);
  }
  if (sync_ranks(c, "reducescatter done")) return -1;
  if (std_teardown(c)) return -1;
  if (c->hc.rank == 0)
    detailf(c, "9 type/op/bytesPerRank cases x (whole, ~0.7 and ~1.6 x bpr windows): %d calls, exact, %.0f ms", ncalls,
            t_total);
  return 0;
}

/* ---------------------------------------------------------------- inflight */

static int scn_inflight(rctx_t* c) {
  if (std_setup(c)) return -1;
  static const struct {
    int dt, op;
    size_t count;
  } spec[4] = {{7, 0, 1 << 16}, {2, 2, 1000}, {8, 1, 4097}, {9, 0, 100000}};
  gbuf_t sb[4], rb[4];
  void *smh[4], *rmh[4];
  size_t maxb = 0;
  for (int i = 0; i < 4; i++) {
    size_t b = spec[i].count * (size_t)g_eltsize[spec[i].dt];
    if (b > maxb) maxb = b;
    if (gbuf_alloc(c, &sb[i], b, "send") || gbuf_alloc(c, &rb[i], b, "recv")) return -1;
    if (regmr(c, sb[i].p, b, &smh[i], "send") || regmr(c, rb[i].p, b, &rmh[i], "recv")) return -1;
  }
  unsigned char* scratch = malloc(maxb * (size_t)c->hc.nranks);
  if (!scratch) return failf(c, "out of memory");
  int nulls = 0;
  const int rounds = 4;
  for (int round = 0; round < rounds; round++) {
    cop_t ops[4];
    cop_t* posted[4];
    uint64_t seeds[4][MAXR];
    for (int i = 0; i < 4; i++) {
      size_t b = spec[i].count * (size_t)g_eltsize[spec[i].dt];
      for (int r = 0; r < c->hc.nranks; r++) seeds[i][r] = seed_of((uint64_t)r, 0x1F1 + (uint64_t)round * 4, (uint64_t)i);
      gen_buf(spec[i].dt, spec[i].op, MODE_EXACT, seeds[i][c->hc.rank], spec[i].count, sb[i].p);
      gbuf_arm(&rb[i], 0, b, 0x5A);
      cop_t* o = &ops[i];
      memset(o, 0, sizeof *o);
      o->kind = K_AR;
      o->send = sb[i].p;
      o->recv = rb[i].p;
      o->count = spec[i].count;
      o->dt = spec[i].dt;
      o->op = spec[i].op;
      o->smh = smh[i];
      o->rmh = rmh[i];
      snprintf(o->what, sizeof o->what, "round %d op #%d iallreduce(%s %s count %zu)", round, i, tname(o->dt),
               oname(o->op), o->count);
      if (cop_post(c, o, posted, i)) return -1;
      posted[i] = o;
      nulls += o->nulls;
    }
    /* completion order: rank- and round-dependent; each request is polled ALONE until it is done,
     * so test() on any request must make progress (ranks wait on different requests meanwhile) */
    int order[4];
    for (int i = 0; i < 4; i++) order[i] = (c->hc.rank + round + (round % 2 ? 3 * i : 4 - i)) % 4;
    int seen[4] = {0, 0, 0, 0};
    for (int i = 0; i < 4; i++) { /* make it a permutation */
      while (seen[order[i]]) order[i] = (order[i] + 1) % 4;
      seen[order[i]] = 1;
    }
    for (int i = 0; i < 4; i++) {
      cop_t* one[1] = {&ops[order[i]]};
      if (cop_wait(c, one, 1)) return -1;
    }
    for (int i = 0; i < 4; i++) {
      size_t b = spec[i].count * (size_t)g_eltsize[spec[i].dt];
      if (ops[i].size != (int)b) return failf(c, "%s: test() reported size %d, expected %zu", ops[i].what, ops[i].size, b);
      if (gbuf_guard_bad(&rb[i], 0, b) >= 0) return failf(c, "%s: written outside the recv buffer", ops[i].what);
      char msg[256] = "";
      size_t bad = check_reduction(spec[i].dt, spec[i].op, MODE_EXACT, c->hc.nranks, seeds[i], spec[i].count, rb[i].p,
                                   scratch, msg, sizeof msg);
      if (bad) return failf(c, "%s: %zu elements wrong; first: %s", ops[i].what, bad, msg);
    }
  }
  for (int i = 0; i < 4; i++) {
    if (deregmr(c, smh[i], "send") || deregmr(c, rmh[i], "recv")) return -1;
    gbuf_free(&sb[i]);
    gbuf_free(&rb[i]);
  }
  free(scratch);
  if (sync_ranks(c, "inflight done")) return -1;
  if (std_teardown(c)) return -1;
  if (c->hc.rank == 0)
    detailf(c, "%d rounds of 4 concurrent iallreduce, each polled alone in a rank-dependent order; %d NULL requests",
            rounds, nulls);
  return 0;
}

/* ---------------------------------------------------------------- twocomms */

/* Two communicators in one process, as NCCL has with two process groups: v11+ init (ctx, commId)
 * twice; each listens and connects its own collComm; operations on both are in flight at once. */
static int scn_twocomms(rctx_t* c) {
  if (open_lib(c)) return -1;
  if (cn_init_checked(c, g_version, comm_id(c))) return -1;
  cn_t b = c->cn; /* same table; v11+: its own ctx from a second init */
  int own_ctx = g_version >= 11;
  if (own_ctx) {
    b.ctx = NULL;
    stagef(c, "second init (commId B)");
    ncclResult_t r = cn_init(&b, comm_id(c) + 0xB000);
    if (r != ncclSuccess) return failf(c, "second v%d init (another communicator) returned %d (%s)", g_version, r, rstr(r));
    if (b.ctx != NULL && b.ctx == c->cn.ctx) return failf(c, "the second init returned the same ctx %p as the first", b.ctx);
  }
  void *cca = NULL, *ccb = NULL;
  if (cn_connect_all(c, 0, &cca, NULL)) return -1;
  cn_t save = c->cn;
  c->cn = b;
  int rc = cn_connect_all(c, 0, &ccb, NULL);
  c->cn = save;
  if (rc) return -1;
  if (cca == ccb) return failf(c, "both communicators got the same collComm %p", cca);
  c->cc = cca;
  static const struct {
    int dt, op;
    size_t count;
  } spec[2] = {{7, 0, 100000}, {2, 2, 1000}};
  gbuf_t sb[2], rb[2];
  void *smh[2], *rmh[2];
  size_t maxb = 0;
  for (int i = 0; i < 2; i++) {
    size_t bytes = spec[i].count * (size_t)g_eltsize[spec[i].dt];
    if (bytes > maxb) maxb = bytes;
    if (gbuf_alloc(c, &sb[i], bytes, "send") || gbuf_alloc(c, &rb[i], bytes, "recv")) return -1;
    cn_t* n = i ? &b : &c->cn;
    void* cc = i ? ccb : cca;
    stagef(c, "regMr on comm %c", 'A' + i);
    smh[i] = rmh[i] = NULL;
    ncclResult_t r = cn_regmr(n, cc, sb[i].p, bytes, NCCL_PTR_HOST, &smh[i]);
    if (r == ncclSuccess) r = cn_regmr(n, cc, rb[i].p, bytes, NCCL_PTR_HOST, &rmh[i]);
    if (r != ncclSuccess || !smh[i] || !rmh[i]) return failf(c, "regMr on comm %c returned %d (%s)", 'A' + i, r, rstr(r));
  }
  unsigned char* scratch = malloc(maxb * (size_t)c->hc.nranks);
  if (!scratch) return failf(c, "out of memory");
  for (int round = 0; round < 3; round++) {
    cop_t ops[2];
    cop_t* posted[2];
    uint64_t seeds[2][MAXR];
    for (int i = 0; i < 2; i++) {
      size_t bytes = spec[i].count * (size_t)g_eltsize[spec[i].dt];
      for (int r = 0; r < c->hc.nranks; r++) seeds[i][r] = seed_of((uint64_t)r, 0x2C0 + (uint64_t)round, (uint64_t)i);
      gen_buf(spec[i].dt, spec[i].op, MODE_EXACT, seeds[i][c->hc.rank], spec[i].count, sb[i].p);
      gbuf_arm(&rb[i], 0, bytes, 0x5A);
      cop_t* o = &ops[i];
      memset(o, 0, sizeof *o);
      o->kind = K_AR;
      o->cn = i ? &b : &c->cn;
      o->cc = i ? ccb : cca;
      o->send = sb[i].p;
      o->recv = rb[i].p;
      o->count = spec[i].count;
      o->dt = spec[i].dt;
      o->op = spec[i].op;
      o->smh = smh[i];
      o->rmh = rmh[i];
      snprintf(o->what, sizeof o->what, "round %d comm %c iallreduce(%s %s count %zu)", round, 'A' + i, tname(o->dt),
               oname(o->op), o->count);
    }
    /* even rounds post A then B, odd rounds B then A; completion: the other comm's op first, alone */
    int first = round % 2;
    if (cop_post(c, &ops[first], NULL, 0)) return -1;
    posted[0] = &ops[first];
    if (cop_post(c, &ops[1 - first], posted, 1)) return -1;
    cop_t* w1[1] = {&ops[1 - first]};
    cop_t* w2[1] = {&ops[first]};
    if (cop_wait(c, w1, 1) || cop_wait(c, w2, 1)) return -1;
    for (int i = 0; i < 2; i++) {
      size_t bytes = spec[i].count * (size_t)g_eltsize[spec[i].dt];
      if (ops[i].size != (int)bytes) return failf(c, "%s: test() size %d, expected %zu", ops[i].what, ops[i].size, bytes);
      if (gbuf_guard_bad(&rb[i], 0, bytes) >= 0) return failf(c, "%s: written outside the recv buffer", ops[i].what);
      char msg[256] = "";
      size_t bad = check_reduction(spec[i].dt, spec[i].op, MODE_EXACT, c->hc.nranks, seeds[i], spec[i].count, rb[i].p,
                                   scratch, msg, sizeof msg);
      if (bad) return failf(c, "%s: %zu elements wrong; first: %s", ops[i].what, bad, msg);
    }
  }
  free(scratch);
  for (int i = 0; i < 2; i++) {
    cn_t* n = i ? &b : &c->cn;
    void* cc = i ? ccb : cca;
    ncclResult_t r = cn_deregmr(n, cc, smh[i]);
    if (r == ncclSuccess) r = cn_deregmr(n, cc, rmh[i]);
    if (r != ncclSuccess) return failf(c, "deregMr on comm %c returned %d (%s)", 'A' + i, r, rstr(r));
    gbuf_free(&sb[i]);
    gbuf_free(&rb[i]);
  }
  if (sync_ranks(c, "twocomms done")) return -1;
  /* close B (and finalize its ctx) first, then A still works for one more allreduce */
  stagef(c, "closeColl B");
  ncclResult_t r = cn_close_coll(&b, ccb);
  if (r != ncclSuccess) return failf(c, "closeColl(B) returned %d (%s)", r, rstr(r));
  if (own_ctx) {
    r = cn_finalize(&b);
    if (r != ncclSuccess) return failf(c, "finalize(ctx B) returned %d (%s)", r, rstr(r));
  }
  {
    gbuf_t s1, r1;
    void *m1, *m2;
    if (gbuf_alloc(c, &s1, 4000, "send") || gbuf_alloc(c, &r1, 4000, "recv")) return -1;
    if (regmr(c, s1.p, 4000, &m1, "send") || regmr(c, r1.p, 4000, &m2, "recv")) return -1;
    uint64_t seeds[MAXR] = {0};
    for (int q = 0; q < c->hc.nranks; q++) seeds[q] = seed_of((uint64_t)q, 0x2CF, 0);
    gen_buf(7, 0, MODE_EXACT, seeds[c->hc.rank], 1000, s1.p);
    cop_t o;
    memset(&o, 0, sizeof o);
    o.kind = K_AR;
    o.send = s1.p;
    o.recv = r1.p;
    o.count = 1000;
    o.dt = 7;
    o.op = 0;
    o.smh = m1;
    o.rmh = m2;
    snprintf(o.what, sizeof o.what, "comm A iallreduce(float sum count 1000) after comm B was closed%s",
             own_ctx ? " and finalized" : "");
    if (cop_run(c, &o)) return -1;
    unsigned char* sc = malloc(4000 * (size_t)c->hc.nranks);
    char msg[256] = "";
    if (!sc) return failf(c, "out of memory");
    size_t bad = check_reduction(7, 0, MODE_EXACT, c->hc.nranks, seeds, 1000, r1.p, sc, msg, sizeof msg);
    free(sc);
    if (bad) return failf(c, "%s: %zu elements wrong; first: %s", o.what, bad, msg);
    if (deregmr(c, m1, "send") || deregmr(c, m2, "recv")) return -1;
    gbuf_free(&s1);
    gbuf_free(&r1);
  }
  if (sync_ranks(c, "comm A done")) return -1;
  if (std_teardown(c)) return -1;
  if (c->hc.rank == 0)
    detailf(c, "2 collComms%s, 3 rounds with one allreduce in flight on each; A still works after B closed",
            own_ctx ? " from 2 init ctxs" : " (one init: v6-v10)");
  return 0;
}

/* ---------------------------------------------------------------- kill */

#define KILL_COUNT ((size_t)2 << 20) /* 8 MiB of floats */

static int scn_kill(rctx_t* c) {
  if (std_setup(c)) return -1;
  const int victim = c->hc.rank == g_kill_victim;
  gbuf_t sb = {0}, rb = {0};
  size_t bytes = KILL_COUNT * 4;
  if (gbuf_alloc(c, &sb, bytes, "send") || gbuf_alloc(c, &rb, bytes, "recv")) return -1;
  for (size_t i = 0; i < KILL_COUNT; i++) ((float*)sb.p)[i] = (float)(c->hc.rank + 1);
  void *smh, *rmh;
  if (regmr(c, sb.p, bytes, &smh, "send") || regmr(c, rb.p, bytes, &rmh, "recv")) return -1;
  const float want = (float)(c->hc.nranks * (c->hc.nranks + 1) / 2);
  long long completed = 0, after = 0;
  int64_t start = now_ns(), limit_ns = (int64_t)(g_kill_timeout_ms + 5000) * 1000000LL;
  ncclResult_t err = ncclSuccess;
  const char* where = "";
  int spins = 0;
  for (;;) {
    /* post */
    void* req = NULL;
    cop_t o;
    memset(&o, 0, sizeof o);
    snprintf(o.what, sizeof o.what, "iallreduce #%lld (float sum, 8 MiB)", completed);
    stagef(c, "post %s", o.what);
    for (;;) {
      ncclResult_t r = cn_iallreduce(&c->cn, c->cc, sb.p, rb.p, KILL_COUNT, 7, 0, smh, rmh, &req);
      if (r != ncclSuccess) {
        err = r;
        where = "iallreduce()";
        break;
      }
      if (req) break;
      int64_t kn = atomic_load(&c->shm->b.kill_ns);
      if (kn && now_ns() > kn + limit_ns) break;
      if (now_ns() - start > 120000000000LL) return failf(c, "iallreduce kept returning NULL");
      backoff(&spins);
    }
    if (err == ncclSuccess && req) {
      stagef(c, "test %s", o.what);
      int done = 0, size = -1;
      spins = 0;
      for (;;) {
        ncclResult_t r = cn_test(&c->cn, req, &done, &size);
        if (r != ncclSuccess) {
          err = r;
          where = "test()";
          break;
        }
        if (done) break;
        int64_t kn = atomic_load(&c->shm->b.kill_ns);
        if (kn && now_ns() > kn + limit_ns) break;
        if (!kn && now_ns() - start > 90000000000LL)
          return failf(c, "%s never completed and the parent never killed the victim", o.what);
        backoff(&spins);
      }
      if (err == ncclSuccess && done) {
        if (size != (int)bytes) return failf(c, "%s: test() size %d, expected %zu", o.what, size, bytes);
        if (((float*)rb.p)[0] != want || ((float*)rb.p)[KILL_COUNT - 1] != want)
          return failf(c, "%s: wrong result %g (expected %g)", o.what, (double)((float*)rb.p)[0], (double)want);
        completed++;
        if (atomic_load(&c->shm->b.kill_ns)) after++;
        atomic_store(&c->shm->b.progress[c->hc.rank], completed);
      }
    }
    int64_t kn = atomic_load(&c->shm->b.kill_ns);
    if (err != ncclSuccess) {
      if (victim || !kn)
        return failf(c, "%s returned %d (%s) before any rank was killed (after %lld completed)", where, err, rstr(err),
                     completed);
      break;
    }
    if (victim && now_ns() - start > 120000000000LL) return failf(c, "the victim was never killed");
    if (kn && now_ns() > kn + limit_ns)
      return failf(c, "no error %.1f s after rank %d was SIGKILLed (limit: FABRICOLL_TIMEOUT_MS=%d + 5 s); %lld "
                   "collectives completed after the kill, stage: %s", (double)(now_ns() - kn) / 1e9, g_kill_victim,
                   g_kill_timeout_ms, after, c->shm->b.stage[c->hc.rank]);
  }
  double ms = (double)(now_ns() - atomic_load(&c->shm->b.kill_ns)) / 1e6;
  stagef(c, "closeColl after the error");
  int64_t t0 = now_ns();
  ncclResult_t r = cn_close_coll(&c->cn, c->cc);
  c->cc = NULL;
  double cms = ms_since(t0);
  atomic_store(&c->shm->closed_ns[c->hc.rank], now_ns());
  vlog("[kill rank %d] closeColl returned %d after %.1f ms\n", c->hc.rank, r, cms);
  if (cms > 10000) return failf(c, "closeColl after the error took %.0f ms", cms);
  r = cn_finalize(&c->cn);
  atomic_store(&c->shm->kerr[c->hc.rank], (int)err);
  atomic_store(&c->shm->kms_x10[c->hc.rank], (long long)(ms * 10));
  atomic_store(&c->shm->kdone[c->hc.rank], completed - after);
  vlog("[kill rank %d] %s returned %d (%s) %.0f ms after the SIGKILL\n", c->hc.rank, where, err, rstr(err), ms);
  return 0;
}

/* ---------------------------------------------------------------- versions */

static int scn_versions(rctx_t* c) {
  if (open_lib(c)) return -1;
  char det[DETAIL_LEN] = "";
  for (int v = NET_MIN_VERSION; v <= NET_MAX_VERSION; v++) {
    if (cn_init_checked(c, v, comm_id(c) + 0x100 * (uint64_t)v)) return -1;
    double cms = 0;
    if (cn_connect_all(c, 0, &c->cc, &cms)) return -1;
    /* allreduce int32 sum, 1000 elements, through this version's own iallreduce (int count for v6-v8) */
    const size_t count = 1000 + (size_t)v;
    gbuf_t sb = {0}, rb = {0};
    if (gbuf_alloc(c, &sb, count * 4, "send") || gbuf_alloc(c, &rb, count * 4, "recv")) return -1;
    void *smh, *rmh;
    if (regmr(c, sb.p, count * 4, &smh, "send") || regmr(c, rb.p, count * 4, &rmh, "recv")) return -1;
    uint64_t seeds[MAXR] = {0};
    for (int r = 0; r < c->hc.nranks; r++) seeds[r] = seed_of((uint64_t)r, 0x7E5, (uint64_t)v);
    gen_buf(2, 0, MODE_EXACT, seeds[c->hc.rank], count, sb.p);
    gbuf_arm(&rb, 0, count * 4, 0x5A);
    cop_t o;
    memset(&o, 0, sizeof o);
    o.kind = K_AR;
    o.send = sb.p;
    o.recv = rb.p;
    o.count = count;
    o.dt = 2;
    o.op = 0;
    o.smh = smh;
    o.rmh = rmh;
    snprintf(o.what, sizeof o.what, "v%d iallreduce(int32 sum, count %zu)", v, count);
    if (cop_run(c, &o)) return -1;
    if (o.size != (int)(count * 4)) return failf(c, "%s: test() size %d, expected %zu", o.what, o.size, count * 4);
    unsigned char* scratch = malloc(count * 4 * (size_t)c->hc.nranks);
    char msg[256] = "";
    if (!scratch) return failf(c, "out of memory");
    size_t bad = check_reduction(2, 0, MODE_EXACT, c->hc.nranks, seeds, count, rb.p, scratch, msg, sizeof msg);
    free(scratch);
    if (bad) return failf(c, "%s: %zu elements wrong; first: %s", o.what, bad, msg);
    if (gbuf_guard_bad(&rb, 0, count * 4) >= 0) return failf(c, "%s: written outside the recv buffer", o.what);
    if (v >= 8) {
      /* allgather of 100 bytes per rank and a float reducescatter, whole window, this version's SGE */
      size_t bpr = 100, total = bpr * (size_t)c->hc.nranks;
      gbuf_t ab = {0};
      if (gbuf_alloc(c, &ab, total, "allgather")) return -1;
      void* amh;
      if (regmr(c, ab.p, total, &amh, "allgather")) return -1;
      pat_fill(sb.p, bpr, seeds[c->hc.rank]);
      memset(&o, 0, sizeof o);
      o.kind = K_AG;
      o.send = sb.p;
      o.smh = smh;
      o.part.mhandle = amh;
      o.part.address = ab.p;
      o.part.size = total;
      o.bpr = bpr;
      o.off = 0;
      o.wb = total;
      snprintf(o.what, sizeof o.what, "v%d iallgather(bytesPerRank %zu, whole window)", v, bpr);
      gbuf_arm(&ab, 0, total, 0x5A);
      if (cop_run(c, &o)) return -1;
      for (size_t j = 0; j < total; j++)
        if (ab.p[j] != pat_byte(seeds[j / bpr], j % bpr))
          return failf(c, "%s: byte %zu is 0x%02x, expected 0x%02x", o.what, j, ab.p[j], pat_byte(seeds[j / bpr], j % bpr));
      if (gbuf_guard_bad(&ab, 0, total) >= 0) return failf(c, "%s: written outside the window", o.what);
      /* reducescatter: float sum; rank r's input element j = r + 1 + j  */
      size_t pe = 64, ptot = pe * (size_t)c->hc.nranks;
      float* fin = (float*)sb.p;
      if (ptot > count) return failf(c, "internal: versions buffer too small");
      for (size_t j = 0; j < ptot; j++) fin[j] = (float)(c->hc.rank + 1) + (float)j;
      gbuf_arm(&rb, 0, pe * 4, CANARY);
      memset(&o, 0, sizeof o);
      o.kind = K_RS;
      o.part.mhandle = smh;
      o.part.address = fin;
      o.part.size = ptot * 4;
      o.recv = rb.p;
      o.rmh = rmh;
      o.dt = 7;
      o.op = 0;
      o.bpr = pe * 4;
      o.off = 0;
      o.wb = ptot * 4;
      snprintf(o.what, sizeof o.what, "v%d ireducescatter(float sum, bytesPerRank %zu, whole window)", v, pe * 4);
      if (cop_run(c, &o)) return -1;
      const float* out = (const float*)rb.p;
      float base = (float)(c->hc.nranks * (c->hc.nranks + 1) / 2);
      for (size_t j = 0; j < pe; j++) {
        float want = base + (float)c->hc.nranks * (float)((size_t)c->hc.rank * pe + j);
        if (out[j] != want) return failf(c, "%s: element %zu is %g, expected %g", o.what, j, (double)out[j], (double)want);
      }
      if (gbuf_guard_bad(&rb, 0, pe * 4) >= 0) return failf(c, "%s: written outside the own slice", o.what);
      if (deregmr(c, amh, "allgather")) return -1;
      gbuf_free(&ab);
    }
    if (deregmr(c, smh, "send") || deregmr(c, rmh, "recv")) return -1;
    gbuf_free(&sb);
    gbuf_free(&rb);
    if (sync_ranks(c, "version done")) return -1;
    if (std_teardown(c)) return -1;
    snprintf(det + strlen(det), sizeof det - strlen(det), "v%d ok (connect %.0f ms%s); ", v, cms,
             v >= 8 ? ", ag+rs" : "");
  }
  size_t dl = strlen(det);
  if (dl >= 2) det[dl - 2] = 0; /* trailing "; " */
  if (c->hc.rank == 0) detailf(c, "%s", det);
  return 0;
}

/* ================================================================= bench */

static size_t g_bmin = 64 << 10, g_bmax = 64 << 20, g_bfactor = 2;
static int g_biters = 20, g_bwarm = 5, g_bcheck = 1;
/* --chunk C --inflight K: each size is cut into C-byte iallreduce calls with up to K in flight, the
 * way NCCL's proxy hands CollNet one chunk per call (0 = the whole size in one call). */
#define MAXINFLIGHT 64
static size_t g_bchunk = 0;
static int g_binflight = 8;
static int g_bench_nsizes;
static size_t g_bench_sizes[MAXSIZES];

static int bench_wait(rctx_t* c, void* req, size_t bytes) {
  int done = 0, size = -1, spins = 0;
  int64_t deadline = op_deadline(c);
  for (;;) {
    ncclResult_t r = cn_test(&c->cn, req, &done, &size);
    if (r != ncclSuccess) return failf(c, "bench: test() returned %d (%s) at %zu bytes", r, rstr(r), bytes);
    if (done) break;
    if (++spins > 64) {
      sched_yield();
      if ((spins & 1023) == 0) {
        if (check_abort(c)) return -1;
        if (now_ns() > deadline) return failf(c, "bench: %zu-byte iallreduce never completed", bytes);
      }
    }
  }
  if (size != (int)bytes) return failf(c, "bench: test() size %d, expected %zu", size, bytes);
  return 0;
}

static int bench_one(rctx_t* c, float* s, float* r, void* smh, void* rmh, size_t count) {
  void* req = NULL;
  int spins = 0;
  int64_t deadline = 0;
  for (;;) {
    ncclResult_t rc = cn_iallreduce(&c->cn, c->cc, s, r, count, 7, 0, smh, rmh, &req);
    if (rc != ncclSuccess) return failf(c, "bench: iallreduce(count %zu) returned %d (%s)", count, rc, rstr(rc));
    if (req) break;
    if (!deadline) deadline = op_deadline(c);
    if (now_ns() > deadline) return failf(c, "bench: iallreduce kept returning NULL");
    backoff(&spins);
  }
  return bench_wait(c, req, count * 4);
}

/* One size as NCCL's proxy runs it: C-byte chunks posted in order, up to K in flight, the oldest
 * polled with test() (a chunk completes in order in NCCL's FIFO, so the oldest gates the next). */
static int bench_chunked(rctx_t* c, float* s, float* r, void* smh, void* rmh, size_t count) {
  size_t per = g_bchunk / 4, nchunks = (count + per - 1) / per, posted = 0, done = 0;
  void* reqs[MAXINFLIGHT] = {0};
  int64_t deadline = op_deadline(c);
  int spins = 0;
  while (done < nchunks) {
    while (posted < nchunks && posted - done < (size_t)g_binflight) {
      size_t off = posted * per, n = count - off < per ? count - off : per;
      void* req = NULL;
      ncclResult_t rc = cn_iallreduce(&c->cn, c->cc, s + off, r + off, n, 7, 0, smh, rmh, &req);
      if (rc != ncclSuccess) return failf(c, "bench: iallreduce(chunk %zu, count %zu) returned %d (%s)", posted, n, rc, rstr(rc));
      if (!req) break; /* busy: poll what is in flight, post again later */
      reqs[posted % MAXINFLIGHT] = req;
      posted++;
    }
    if (posted > done) {
      size_t n = count - done * per < per ? count - done * per : per;
      int fin = 0, size = -1;
      ncclResult_t rc = cn_test(&c->cn, reqs[done % MAXINFLIGHT], &fin, &size);
      if (rc != ncclSuccess) return failf(c, "bench: test() of chunk %zu returned %d (%s)", done, rc, rstr(rc));
      if (fin) {
        if (size != (int)(n * 4)) return failf(c, "bench: chunk %zu: test() size %d, expected %zu", done, size, n * 4);
        done++;
        spins = 0;
        continue;
      }
    }
    if (++spins > 64) {
      sched_yield();
      if ((spins & 1023) == 0) {
        if (check_abort(c)) return -1;
        if (now_ns() > deadline) return failf(c, "bench: %zu-byte chunked iallreduce never completed", count * 4);
      }
    }
  }
  return 0;
}

static int bench_size(rctx_t* c, float* s, float* r, void* smh, void* rmh, size_t count) {
  if (g_bchunk && count * 4 > g_bchunk) return bench_chunked(c, s, r, smh, rmh, count);
  return bench_one(c, s, r, smh, rmh, count);
}

static int scn_bench(rctx_t* c) {
  if (std_setup(c)) return -1;
  gbuf_t sb = {0}, rb = {0};
  if (gbuf_alloc(c, &sb, g_bmax, "send") || gbuf_alloc(c, &rb, g_bmax, "recv")) return -1;
  size_t maxcount = g_bmax / 4;
  float* s = (float*)sb.p;
  float* r = (float*)rb.p;
  for (size_t i = 0; i < maxcount; i++) s[i] = (float)((c->hc.rank + (int)(i % 7)) % 5);
  void *smh, *rmh;
  if (regmr(c, sb.p, g_bmax, &smh, "send") || regmr(c, rb.p, g_bmax, &rmh, "recv")) return -1;
  for (int k = 0; k < g_bench_nsizes; k++) {
    size_t count = g_bench_sizes[k] / 4;
    for (int i = 0; i < g_bwarm; i++)
      if (bench_size(c, s, r, smh, rmh, count)) return -1;
    if (sync_ranks(c, "bench size")) return -1;
    int64_t t0 = now_ns();
    for (int i = 0; i < g_biters; i++)
      if (bench_size(c, s, r, smh, rmh, count)) return -1;
    c->shm->bench_us[c->hc.rank][k] = (double)(now_ns() - t0) / 1e3 / g_biters;
    if (g_bcheck) {
      int bad = 0;
      for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int q = 0; q < c->hc.nranks; q++) want += (float)((q + (int)(i % 7)) % 5);
        if (r[i] != want) bad++;
      }
      c->shm->bench_bad[c->hc.rank][k] = bad;
    }
  }
  if (sync_ranks(c, "bench done")) return -1;
  if (deregmr(c, smh, "send") || deregmr(c, rmh, "recv")) return -1;
  gbuf_free(&sb);
  gbuf_free(&rb);
  return std_teardown(c);
}

/* ================================================================= parent / runner */

typedef struct {
  const char* name;
  int (*fn)(rctx_t*);
  int timeout_s;            /* for 2 ranks; scaled by nranks/2 */
  int short_timeout_env;    /* FABRICOLL_TIMEOUT_MS = g_kill_timeout_ms in the ranks */
  int (*hook)(hc_runstate_t*);
  int fixed_ranks;          /* 0: the rank-count list */
  int min_version;
  const char* help;
} scenario_t;

/* In a forked rank (hc_run_ranks): the scenario with this harness's context around *h. */
static int rank_main(const void* arg, hc_rank_t* h, void* shm) {
  rctx_t c = {.hc = *h, .shm = shm};
  int rc = ((const scenario_t*)arg)->fn(&c);
  *h = c.hc;
  return rc;
}

/* Runs the scenario with nranks ranks once; 0 = all good. reason/details are appended to. With
 * shm_out the shared struct is handed back (munmap it), else unmapped. */
static int run_ranks(const scenario_t* spec, int nranks, struct shm** shm_out, char* reason, size_t rlen,
                     char* details, size_t dlen) {
  hc_runspec_t hs = {spec->name, nranks, (int)(spec->timeout_s * g_time_scale * (nranks > 2 ? nranks / 2.0 : 1.0)),
                     g_op_timeout_ms, spec->short_timeout_env ? g_kill_timeout_ms : 0, sizeof(struct shm), rank_main,
                     spec, spec->hook, g_kill_victim};
  void* shm = NULL;
  int r = hc_run_ranks(&hs, reason, rlen, details, dlen, NULL, shm_out ? &shm : NULL);
  if (shm_out) *shm_out = shm;
  return r;
}

/* kill: the parent SIGKILLs the victim once every rank has completed 2 collectives */
static int kill_hook(hc_runstate_t* rs) {
  struct shm* shm = rs->shm;
  int64_t kill_ns = atomic_load(&shm->b.kill_ns);
  if (kill_ns) {
    double since = (double)(now_ns() - kill_ns) / 1e9;
    for (int s = 0; s < rs->spec->nranks; s++)
      if (s != g_kill_victim && !rs->exited[s] && since > (g_kill_timeout_ms + 5000) / 1000.0 + 5) {
        snprintf(rs->reason, sizeof rs->reason,
                 "rank %d (survivor) is stuck inside a plugin call %.0f s after rank %d was SIGKILLed (stage: %s); "
                 "stacks on stderr",
                 s, since, g_kill_victim, shm->b.stage[s]);
        dump_stacks("kill", s, rs->pid[s]);
        return -1;
      }
    return 0;
  }
  int all = 1;
  for (int r = 0; r < rs->spec->nranks; r++)
    if (atomic_load(&shm->b.progress[r]) < 2) all = 0;
  if (all) {
    int v = g_kill_victim;
    atomic_store(&shm->b.kill_ns, now_ns());
    rs->expect_killed[v] = 1;
    kill(rs->pid[v], SIGKILL);
    vlog("[kill] parent SIGKILLed rank %d (pid %d)\n", v, (int)rs->pid[v]);
    return 0;
  }
  if (now_ns() - rs->start > 60000000000LL) {
    snprintf(rs->reason, sizeof rs->reason, "the 8 MiB allreduce loop never got going (60 s; rank 0 stage: %s)",
             shm->b.stage[0]);
    return -1;
  }
  return 0;
}

static scenario_t g_scen[] = {
    {"symbols", scn_symbols, 90, 0, NULL, 0, 6,
     "v6..v12 resolve as data symbols of the right size, members, init/devices/getProperties each, connect"},
    {"support", scn_support, 90, 0, NULL, 0, 6,
     "reduceSupport 12 types x 4 ops (printed), beyond-range probes, regMr/deregMr, regMrDmaBuf fails"},
    {"allreduce", scn_allreduce, 240, 0, NULL, 0, 6,
     "every type x op on counts 1/1000/65537, 1Mi for 6 cases, random mantissas, in place; exact, bit-identical"},
    {"allgather", scn_allgather, 180, 0, NULL, 0, 8,
     "iallgather, one part, bytesPerRank 1/4099/1MiB: whole buffer, then unaligned windows covering it"},
    {"reducescatter", scn_reducescatter, 180, 0, NULL, 0, 8,
     "ireducescatter, one part, 9 type/op/bpr cases: whole buffer, then unaligned windows covering it"},
    {"inflight", scn_inflight, 120, 0, NULL, 0, 6,
     "4 iallreduce in flight on one collComm, each completed alone in a rank-dependent order"},
    {"twocomms", scn_twocomms, 120, 0, NULL, 0, 6,
     "two communicators in one process (v11+: two init ctxs), ops in flight on both, close one, use the other"},
    {"kill", scn_kill, 120, 1, kill_hook, 4, 6,
     "4 ranks; SIGKILL rank 2, then rank 0, during 8 MiB allreduces: survivors' test() must fail in time"},
    {"versions", scn_versions, 180, 0, NULL, 0, 6,
     "connect + allreduce (+ allgather/reducescatter for v8+) through each of v6..v12's own table"},
};
#define NSCEN ((int)(sizeof g_scen / sizeof g_scen[0]))

static void usage(FILE* f) {
  fprintf(f,
          "usage: collnet_harness --lib PATH [--scenario NAME[,NAME...]|all] [--skip NAME[,...]] [--ranks N[,N...]]\n"
          "                       [--version 6..12] [--op-timeout-ms MS] [--kill-timeout-ms MS] [--time-scale F]\n"
          "       collnet_harness --lib PATH --bench [--ranks R] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP]\n"
          "                       [-c 0|1] [--version V] [--chunk BYTES [--inflight K]]   (sizes accept K/M/G)\n"
          "--chunk cuts each size into BYTES-sized calls with up to K (8) in flight, as NCCL's proxy does.\n"
          "Without --ranks every scenario runs for 2, 3, 4 and 5 ranks (kill: 4 ranks); --ranks 2,5 runs 2 and 5\n"
          "(kill: 4); --ranks N runs everything with N ranks (kill needs N >= 3).\n"
          "scenarios:\n");
  for (int i = 0; i < NSCEN; i++) fprintf(f, "  %-14s %s\n", g_scen[i].name, g_scen[i].help);
}

static size_t parse_size(const char* s) {
  char* end;
  double v = strtod(s, &end);
  switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
  }
  return (size_t)v;
}

static int run_bench(int nranks) {
  g_bench_nsizes = 0;
  for (size_t s = g_bmin; s <= g_bmax && g_bench_nsizes < MAXSIZES; s *= g_bfactor) {
    g_bench_sizes[g_bench_nsizes++] = s & ~(size_t)3;
    if (g_bfactor < 2) break;
  }
  scenario_t spec = {"bench", scn_bench, 1800, 0, NULL, 0, 6, ""};
  char reason[4 * FAIL_LEN] = "", details[2 * DETAIL_LEN] = "";
  struct shm* shm = NULL;
  printf("# collnet_harness bench: iallreduce + test() via %s, %d ranks, float sum, %d warm-up + %d timed "
         "iterations, FABRICOLL_PROVIDER=%s\n",
         cn_symbol_name(g_version), nranks, g_bwarm, g_biters,
         getenv("FABRICOLL_PROVIDER") ? getenv("FABRICOLL_PROVIDER") : "(unset)");
  if (g_bchunk) printf("# chunked as NCCL's proxy: %zu-byte calls, up to %d in flight\n", g_bchunk, g_binflight);
  printf("# time: the slowest rank's mean per size; busbw = 2(n-1)/n x bytes / time\n");
  printf("%12s %12s %12s %8s\n", "size", "time_us", "busbw_GBps", "#wrong");
  fflush(stdout);
  int r = run_ranks(&spec, nranks, &shm, reason, sizeof reason, details, sizeof details);
  if (shm) {
    for (int k = 0; k < g_bench_nsizes; k++) {
      double worst = 0;
      int bad = 0, have = 1;
      for (int q = 0; q < nranks; q++) {
        if (shm->bench_us[q][k] <= 0) have = 0;
        if (shm->bench_us[q][k] > worst) worst = shm->bench_us[q][k];
        bad += shm->bench_bad[q][k];
      }
      if (!have) break;
      double bw = 2.0 * (nranks - 1) / nranks * (double)g_bench_sizes[k] / (worst * 1e3);
      if (g_bcheck) printf("%12zu %12.2f %12.3f %8d\n", g_bench_sizes[k], worst, bw, bad);
      else printf("%12zu %12.2f %12.3f %8s\n", g_bench_sizes[k], worst, bw, "N/A");
      if (bad) r = -1;
    }
    munmap(shm, sizeof *shm);
  }
  if (r != 0) {
    for (char* p = reason; *p; p++)
      if (*p == '\n') *p = ' ';
    printf("# FAIL bench: %s\n", reason[0] ? reason : "wrong results");
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  const char* which = "all";
  const char* skip = NULL;
  int ranks = 0, bench = 0;
  int rlist[MAXR], nrlist = 0; /* --ranks N[,N...] */
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* val = i + 1 < argc ? argv[i + 1] : NULL;
    int takes = !strcmp(a, "--lib") || !strcmp(a, "--scenario") || !strcmp(a, "--skip") || !strcmp(a, "--version") ||
                !strcmp(a, "--op-timeout-ms") || !strcmp(a, "--kill-timeout-ms") || !strcmp(a, "--ranks") ||
                !strcmp(a, "--time-scale") || !strcmp(a, "-b") || !strcmp(a, "-e") || !strcmp(a, "-f") ||
                !strcmp(a, "-n") || !strcmp(a, "-w") || !strcmp(a, "-c") || !strcmp(a, "--chunk") ||
                !strcmp(a, "--inflight");
    if (takes) {
      if (!val) {
        fprintf(stderr, "collnet_harness: %s needs a value\n", a);
        return 2;
      }
      i++;
    }
    if (!strcmp(a, "--lib")) g_lib = val;
    else if (!strcmp(a, "--scenario")) which = val;
    else if (!strcmp(a, "--skip")) skip = val;
    else if (!strcmp(a, "--version")) g_version = atoi(val);
    else if (!strcmp(a, "--op-timeout-ms")) g_op_timeout_ms = atoi(val);
    else if (!strcmp(a, "--kill-timeout-ms")) g_kill_timeout_ms = atoi(val);
    else if (!strcmp(a, "--ranks")) {
      nrlist = 0; /* the last --ranks wins */
      for (const char* p = val; *p && nrlist < MAXR;) {
        rlist[nrlist++] = atoi(p);
        const char* q = strchr(p, ',');
        if (!q) break;
        p = q + 1;
      }
      ranks = nrlist ? rlist[0] : 0;
    }
    else if (!strcmp(a, "--time-scale")) g_time_scale = atof(val);
    else if (!strcmp(a, "-b")) g_bmin = parse_size(val);
    else if (!strcmp(a, "-e")) g_bmax = parse_size(val);
    else if (!strcmp(a, "-f")) g_bfactor = (size_t)atoi(val);
    else if (!strcmp(a, "-n")) g_biters = atoi(val);
    else if (!strcmp(a, "-w")) g_bwarm = atoi(val);
    else if (!strcmp(a, "-c")) g_bcheck = atoi(val);
    else if (!strcmp(a, "--chunk")) g_bchunk = parse_size(val);
    else if (!strcmp(a, "--inflight")) g_binflight = atoi(val);
    else if (!strcmp(a, "--bench")) bench = 1;
    else if (!strcmp(a, "--list") || !strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "collnet_harness: unknown argument %s\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (!g_lib) {
    fprintf(stderr, "collnet_harness: --lib PATH is required\n");
    usage(stderr);
    return 2;
  }
  if (g_version < NET_MIN_VERSION || g_version > NET_MAX_VERSION) {
    fprintf(stderr, "collnet_harness: --version must be 6..12\n");
    return 2;
  }
  for (int k = 0; k < nrlist; k++)
    if (rlist[k] < 1 || rlist[k] > MAXR) {
      fprintf(stderr, "collnet_harness: --ranks values must be 1..%d\n", MAXR);
      return 2;
    }
  if (bench && nrlist > 1) {
    fprintf(stderr, "collnet_harness: --bench takes one rank count\n");
    return 2;
  }
  if (g_op_timeout_ms < 100 || g_kill_timeout_ms < 1 || !(g_time_scale > 0)) {
    fprintf(stderr, "collnet_harness: bad numeric option\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (bench) {
    if (g_bmin < 4 || g_bmax < g_bmin || g_bfactor < 1 || g_biters < 1 || g_bwarm < 0 ||
        (g_bchunk && g_bchunk < 4) || g_binflight < 1 || g_binflight > MAXINFLIGHT) {
      fprintf(stderr, "collnet_harness: bad bench sizes/iterations (--chunk >= 4, --inflight 1..%d)\n", MAXINFLIGHT);
      return 2;
    }
    return run_bench(ranks ? ranks : 2);
  }
  int all = !strcmp(which, "all");
  _Static_assert(offsetof(scenario_t, name) == 0, "unknown_scenario() reads each entry's name first");
  if (!all && unknown_scenario("collnet_harness", which, g_scen, sizeof g_scen[0], NSCEN)) {
    usage(stderr);
    return 2;
  }
  warn_missing_lib("collnet_harness", g_lib);
  fprintf(stderr, "collnet_harness: lib %s, table v%d, FABRICOLL_PROVIDER=%s FABRICOLL_DOMAIN=%s\n", g_lib, g_version,
          getenv("FABRICOLL_PROVIDER") ? getenv("FABRICOLL_PROVIDER") : "(unset)",
          getenv("FABRICOLL_DOMAIN") ? getenv("FABRICOLL_DOMAIN") : "(unset)");
  static const int default_ranks[] = {2, 3, 4, 5};
  int passed = 0, failed = 0;
  for (int i = 0; i < NSCEN; i++) {
    const scenario_t* s = &g_scen[i];
    if (!all && !in_list(which, s->name)) continue;
    if (in_list(skip, s->name)) continue;
    int list[MAXR], nl = 0;
    if (nrlist == 1) list[nl++] = ranks; /* one count: every scenario, kill included, runs with it */
    else if (s->fixed_ranks) list[nl++] = s->fixed_ranks;
    else if (nrlist > 1)
      for (int k = 0; k < nrlist; k++) list[nl++] = rlist[k];
    else
      for (int k = 0; k < 4; k++) list[nl++] = default_ranks[k];
    for (int k = 0; k < nl; k++) {
      int n = list[k];
      if (g_version < s->min_version) {
        printf("SKIP %s np%d (needs table v%d+, running v%d)\n", s->name, n, s->min_version, g_version);
        continue;
      }
      if (!strcmp(s->name, "kill") && n < 3) {
        printf("SKIP %s np%d (needs 3+ ranks)\n", s->name, n);
        continue;
      }
      char reason[4 * FAIL_LEN] = "", details[2 * DETAIL_LEN] = "";
      fprintf(stderr, "collnet_harness: running %s np%d\n", s->name, n);
      int64_t t0 = now_ns();
      int r;
      if (!strcmp(s->name, "kill")) {
        int victims[2] = {n / 2, 0}; /* a middle rank, then rank 0 */
        r = 0;
        for (int vi = 0; vi < 2; vi++) {
          g_kill_victim = victims[vi];
          char r1[2 * FAIL_LEN] = "", d1[DETAIL_LEN] = "";
          struct shm* ks = NULL;
          if (run_ranks(s, n, &ks, r1, sizeof r1, d1, sizeof d1) != 0) {
            r = -1;
            append(reason, sizeof reason, "%svictim rank %d: %s", reason[0] ? " || " : "", victims[vi], r1);
          } else if (ks) {
            append(details, sizeof details, "%svictim %d: survivors' errors", details[0] ? "; " : "", victims[vi]);
            double worst = 0;
            for (int q = 0; q < n; q++)
              if (q != victims[vi]) {
                double ms = (double)atomic_load(&ks->kms_x10[q]) / 10;
                if (ms > worst) worst = ms;
                append(details, sizeof details, " %d", atomic_load(&ks->kerr[q]));
              }
            append(details, sizeof details, " after <= %.0f ms (%lld collectives before)", worst,
                   (long long)atomic_load(&ks->kdone[(victims[vi] + 1) % n]));
          }
          if (ks) munmap(ks, sizeof *ks);
        }
      } else {
        r = run_ranks(s, n, NULL, reason, sizeof reason, details, sizeof details);
      }
      if (!strcmp(s->name, "support")) g_print_matrix = 0;
      double secs = ms_since(t0) / 1000;
      if (r == 0) {
        passed++;
        printf("PASS %s np%d (%s%s%.1f s)\n", s->name, n, details, details[0] ? "; " : "", secs);
      } else {
        failed++;
        for (char* p = reason; *p; p++)
          if (*p == '\n') *p = ' ';
        printf("FAIL %s np%d: %s (%.1f s)\n", s->name, n, reason, secs);
      }
      fflush(stdout);
    }
  }
  printf("collnet_harness: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
