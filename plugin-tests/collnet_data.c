/*
 * collnet_data.c: the data of collnet_harness's collectives (see collnet_harness.h): the twelve
 * NCCL data types and five ops, the small float formats (half, bf16, e4m3, e5m2) read and written
 * bit-exactly, the per-rank inputs of each case and the check of a reduction's result against
 * the value computed here.
 */
#include "collnet_harness.h"

/* ================================================================= data types */

const int g_eltsize[12] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
static const char* g_tname[12] = {"int8", "uint8", "int32", "uint32", "int64", "uint64",
                                  "half", "float", "double", "bf16", "e4m3", "e5m2"};
static const char* g_oname[5] = {"sum", "prod", "max", "min", "avg"};
const char* tname(int t) { return t >= 0 && t < 12 ? g_tname[t] : "?"; }
const char* oname(int o) { return o >= 0 && o < 5 ? g_oname[o] : "?"; }
int is_float(int t) { return t >= 6; }
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
double load_f(int t, const void* buf, size_t i, int* special) {
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

uint64_t load_bits(int t, const void* buf, size_t i) {
  const unsigned char* p = (const unsigned char*)buf + i * (size_t)g_eltsize[t];
  uint64_t v = 0;
  memcpy(&v, p, (size_t)g_eltsize[t]); /* little endian */
  return v;
}

void store_bits(int t, void* buf, size_t i, uint64_t v) {
  memcpy((unsigned char*)buf + i * (size_t)g_eltsize[t], &v, (size_t)g_eltsize[t]);
}

/* stores a double that is exactly representable in type t */
void store_f(int t, void* buf, size_t i, double v) {
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

uint64_t hash_bytes(const void* buf, size_t len) {
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

void gen_buf(int t, int op, int mode, uint64_t seed, size_t count, void* buf) {
  for (size_t i = 0; i < count; i++) gen_elem(t, op, mode, seed, i, buf);
}

uint64_t int_combine(int t, int op, uint64_t a, uint64_t b) {
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

double f_combine(int op, double a, double b) {
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
size_t check_reduction(int t, int op, int mode, int nranks, const uint64_t* seeds, size_t count,
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
