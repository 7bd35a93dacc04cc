/*
 * collnet_table.c: the ncclCollNetPlugin_v6..v12 tables as NCCL calls them (see
 * collnet_harness.h): the logger handed to init, binding a version's table from the library, one
 * caller per member that hides the layout differences between versions, and the check that every
 * member a version defines is set.
 */
#include "collnet_harness.h"

/* ================================================================= plugin logger */

/* Formats every message (bad varargs from the plugin would crash here); WARN messages always go to
 * stderr (the run's log), the others with HARNESS_VERBOSE. */
atomic_long cn_logger_bad_calls;
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

const char* cn_symbol_name(int v) {
  static const char* names[] = {"ncclCollNetPlugin_v6",  "ncclCollNetPlugin_v7",  "ncclCollNetPlugin_v8",
                                "ncclCollNetPlugin_v9",  "ncclCollNetPlugin_v10", "ncclCollNetPlugin_v11",
                                "ncclCollNetPlugin_v12"};
  if (v < NET_MIN_VERSION || v > NET_MAX_VERSION) return "?";
  return names[v - NET_MIN_VERSION];
}

size_t cn_table_size(int v) {
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

int cn_bind(cn_t* n, void* dl, int v, char* err, size_t errlen) {
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

ncclResult_t cn_init(cn_t* n, uint64_t commId) {
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

ncclResult_t cn_finalize(cn_t* n) {
  switch (n->version) {
    case 11: return CHK(n->t11->finalize, n->ctx);
    case 12: return CHK(n->t12->finalize, n->ctx);
    default: return ncclSuccess; /* v6..v10 have no finalize */
  }
}

ncclResult_t cn_devices(cn_t* n, int* ndev) { CN_SAME(n, devices, ndev); }
ncclResult_t cn_get_props_raw(cn_t* n, int dev, void* buf) { CN_SAME(n, getProperties, dev, buf); }

ncclResult_t cn_listen(cn_t* n, int dev, void* handle, void** lc) {
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

ncclResult_t cn_connect(cn_t* n, void** handles, int nranks, int rank, void* lc, void** cc) {
  CN_SAME(n, connect, handles, nranks, rank, lc, cc);
}
ncclResult_t cn_reduce_support(cn_t* n, int dt, int op, int* supported) {
  CN_SAME(n, reduceSupport, (ncclDataType_t)dt, (ncclRedOp_t)op, supported);
}

ncclResult_t cn_regmr(cn_t* n, void* cc, void* data, size_t size, int type, void** mh) {
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

ncclResult_t cn_regmr_dmabuf(cn_t* n, void* cc, void* data, size_t size, int type, uint64_t off, int fd,
                             void** mh) {
  CN_SAME(n, regMrDmaBuf, cc, data, size, type, off, fd, mh);
}
ncclResult_t cn_deregmr(cn_t* n, void* cc, void* mh) { CN_SAME(n, deregMr, cc, mh); }

ncclResult_t cn_iallreduce(cn_t* n, void* cc, void* s, void* r, size_t count, int dt, int op, void* smh,
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

ncclResult_t cn_iallgather(cn_t* n, void* cc, void* send, int np, const cn_sge_t* parts, size_t bpr,
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

ncclResult_t cn_ireducescatter(cn_t* n, void* cc, int np, const cn_sge_t* parts, void* recv, size_t bpr,
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

ncclResult_t cn_iflush(cn_t* n, void* cc, void* data, int size, void* mh, void** req) {
  CN_SAME(n, iflush, cc, data, size, mh, req);
}
ncclResult_t cn_test(cn_t* n, void* req, int* done, int* size) { CN_SAME(n, test, req, done, size); }
ncclResult_t cn_close_coll(cn_t* n, void* cc) { CN_SAME(n, closeColl, cc); }
ncclResult_t cn_close_listen(cn_t* n, void* lc) { CN_SAME(n, closeListen, lc); }

/* Which members of table version v are NULL (for the symbols scenario). Returns a list in `out`. */
int cn_null_members(const cn_t* n, char* out, size_t len, char* optional, size_t olen) {
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
