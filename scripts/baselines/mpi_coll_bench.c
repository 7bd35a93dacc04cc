/*
 * scripts/baselines/mpi_coll_bench.c - the MPI baseline of scripts/bench-coll.sh and
 * scripts/bench-multihost.sh: nccl-tests-style tables for MPI_Allreduce, MPI_Allgather and
 * MPI_Reduce_scatter_block (float32, sum, out of place), so that fabricoll-perf's rows and
 * these can be compared size by size.
 *
 *   mpi_coll_bench [-o allreduce|allgather|reducescatter|all] [-b MIN] [-e MAX] [-f FACTOR]
 *                  [-w WARMUP] [-m MINITERS] [-n MAXITERS] [-t SECONDS] [-c 0|1] [-r REPS]
 *
 * Sizes (K, M, G suffixes) follow nccl-tests: the whole buffer of AllReduce, the gathered
 * output of AllGather, the scattered input of ReduceScatter. Each size runs about SECONDS
 * (its iteration count estimated from the warm-up, kept within MINITERS..MAXITERS); the
 * sweep is repeated REPS times, one sweep after the other, so that one size's samples are
 * spread out in time. Columns: size count type redop iters time tmin algbw busbw #wrong,
 * where time is the median over the repetitions of the ranks' mean time per iteration (us),
 * tmin the best repetition, algbw = size / time and busbw = algbw * 2(n-1)/n (AllReduce) or
 * (n-1)/n (the others), in GB/s (1e9 B/s). With -c 1 every output element is compared with
 * its exact expected value (the inputs are small integers) and the mismatches counted.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum coll { ALLREDUCE, ALLGATHER, REDUCESCATTER, NCOLL };
static const char *const coll_name[NCOLL] = {"allreduce", "allgather", "reducescatter"};

struct opts {
  int colls[NCOLL];
  long long min_bytes, max_bytes;
  double factor, seconds;
  int warmup, min_iters, max_iters, check, reps;
};

static void usage(int rank) {
  if (rank == 0)
    fprintf(stderr, "usage: mpi_coll_bench [-o allreduce|allgather|reducescatter|all] [-b MIN] "
                    "[-e MAX] [-f FACTOR] [-w WARMUP] [-m MINITERS] [-n MAXITERS] [-t SECONDS] "
                    "[-c 0|1] [-r REPS]\n");
  MPI_Finalize();
  exit(2);
}

/* A bad value: one line naming the option and why, then the usage; exits 2 on every rank. */
static void bad(int rank, char opt, const char *v, const char *why) {
  if (rank == 0) fprintf(stderr, "mpi_coll_bench: -%c%s%s: %s\n", opt, *v ? " " : "", v, why);
  usage(rank);
}

/* A size with an optional K, M or G suffix (powers of 1024); anything else is refused. */
static long long bytes_arg(int rank, char opt, const char *s) {
  char *end;
  double v = strtod(s, &end);
  if (end == s) bad(rank, opt, s, "not a number of bytes");
  if (*end == 'k' || *end == 'K') v *= 1 << 10, end++;
  else if (*end == 'm' || *end == 'M') v *= 1 << 20, end++;
  else if (*end == 'g' || *end == 'G') v *= 1 << 30, end++;
  if (*end != 0) bad(rank, opt, s, "unknown suffix (K, M or G)");
  return (long long)v;
}

/* A number (integer where `integer`); anything else is refused. */
static double num_arg(int rank, char opt, const char *s, int integer) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || *end != 0 || (integer && v != (double)(long)v)) bad(rank, opt, s, "not a number");
  return v;
}

static void parse(int argc, char **argv, int rank, struct opts *o) {
  *o = (struct opts){{1, 1, 1}, 8, 64LL << 20, 2.0, 0.2, 5, 5, 1000, 1, 1};
  for (int i = 1; i < argc; i++) {
    if (argv[i][0] != '-' || argv[i][1] == 0 || argv[i][2] != 0) bad(rank, '?', argv[i], "not an option");
    if (i + 1 >= argc) bad(rank, argv[i][1], "", "needs a value");
    char opt = argv[i][1];
    const char *v = argv[++i];
    switch (opt) {
    case 'o':
      for (int c = 0; c < NCOLL; c++) o->colls[c] = !strcmp(v, "all") || !strcmp(v, coll_name[c]);
      if (!o->colls[0] && !o->colls[1] && !o->colls[2])
        bad(rank, opt, v, "not allreduce, allgather, reducescatter or all");
      break;
    case 'b': o->min_bytes = bytes_arg(rank, opt, v); break;
    case 'e': o->max_bytes = bytes_arg(rank, opt, v); break;
    case 'f': o->factor = num_arg(rank, opt, v, 0); break;
    case 'w': o->warmup = (int)num_arg(rank, opt, v, 1); break;
    case 'm': o->min_iters = (int)num_arg(rank, opt, v, 1); break;
    case 'n': o->max_iters = (int)num_arg(rank, opt, v, 1); break;
    case 't': o->seconds = num_arg(rank, opt, v, 0); break;
    case 'c': o->check = (int)num_arg(rank, opt, v, 1); break;
    case 'r': o->reps = (int)num_arg(rank, opt, v, 1); break;
    default: bad(rank, opt, v, "unknown option");
    }
  }
  if (o->factor <= 1.0) bad(rank, 'f', "", "FACTOR must be above 1");
  if (o->min_bytes < 4) bad(rank, 'b', "", "MIN must be at least 4 bytes (one float)");
  if (o->max_bytes < o->min_bytes) bad(rank, 'e', "", "MAX must be at least MIN");
  if (o->reps < 1) bad(rank, 'r', "", "REPS must be at least 1");
  if (o->min_iters < 1 || o->max_iters < o->min_iters)
    bad(rank, 'n', "", "need 1 <= MINITERS (-m) <= MAXITERS (-n)");
  if (o->warmup < 0 || o->seconds < 0) bad(rank, 'w', "", "WARMUP and SECONDS (-t) must not be negative");
}

/* Elements of the size's buffers: what each rank sends and receives. */
static void counts(enum coll c, long long bytes, int n, size_t *send, size_t *recv) {
  size_t total = (size_t)(bytes / 4) / (size_t)n * (size_t)n;
  if (c == ALLREDUCE) total = (size_t)(bytes / 4);
  *send = c == ALLGATHER ? total / n : total;
  *recv = c == REDUCESCATTER ? total / n : total;
}

static void call(enum coll c, const float *s, float *r, size_t send, size_t recv) {
  if (c == ALLREDUCE) MPI_Allreduce(s, r, (int)send, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  else if (c == ALLGATHER) MPI_Allgather(s, (int)send, MPI_FLOAT, r, (int)send, MPI_FLOAT, MPI_COMM_WORLD);
  else MPI_Reduce_scatter_block(s, r, (int)recv, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

/* Rank r's input at element i: a small integer, so every sum is exact in float. */
static float input(int r, size_t i) { return (float)(1 + (r * 31 + (int)(i % 1009)) % 64); }

static long wrong(enum coll c, const float *out, size_t send, size_t recv, int n, int rank) {
  long bad = 0;
  for (size_t j = 0; j < recv; j++) {
    float want = 0;
    if (c == ALLGATHER) want = input((int)(j / send), j % send);
    else {
      size_t at = c == REDUCESCATTER ? rank * recv + j : j;
      for (int q = 0; q < n; q++) want += input(q, at);
    }
    bad += out[j] != want;
  }
  return bad;
}

/* The ranks' mean time per call (us) over `iters` calls. */
static double timed(enum coll c, const float *s, float *r, size_t send, size_t recv, int iters, int n) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int k = 0; k < iters; k++) call(c, s, r, send, recv);
  double mine = (MPI_Wtime() - t0) * 1e6 / iters, sum = 0;
  MPI_Allreduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return sum / n;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  int rank, n;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  struct opts o;
  parse(argc, argv, rank, &o);
  int nsizes = 0;
  for (double b = (double)o.min_bytes; b <= (double)o.max_bytes; b *= o.factor) nsizes++;
  size_t cap = (size_t)(o.max_bytes / 4) + (size_t)n;
  float *s = malloc(cap * sizeof *s), *r = malloc(cap * sizeof *r);
  double *t = calloc((size_t)NCOLL * nsizes * o.reps, sizeof *t);
  int *iters = calloc((size_t)NCOLL * nsizes, sizeof *iters);
  long *bad = calloc((size_t)NCOLL * nsizes, sizeof *bad);
  if (!s || !r || !t || !iters || !bad) MPI_Abort(MPI_COMM_WORLD, 1);
  char lib[MPI_MAX_LIBRARY_VERSION_STRING];
  int len;
  MPI_Get_library_version(lib, &len);
  char *nl = strchr(lib, '\n');
  if (nl) *nl = 0;
  if (rank == 0) printf("# mpi_coll_bench nranks=%d lib=\"%s\"\n# float32 sum, out of place\n", n, lib);
  for (int rep = 0; rep < o.reps; rep++) {
    for (int c = 0; c < NCOLL; c++) {
      if (!o.colls[c]) continue;
      double b = (double)o.min_bytes;
      for (int k = 0; k < nsizes; k++, b *= o.factor) {
        size_t send, recv;
        counts(c, (long long)b, n, &send, &recv);
        if (send == 0 || recv == 0) continue;
        for (size_t i = 0; i < send; i++) s[i] = input(rank, i);
        int *it = &iters[c * nsizes + k];
        if (*it == 0) { /* the first sweep sets the count: the warm-up's time per call */
          double est = timed(c, s, r, send, recv, o.warmup > 0 ? o.warmup : 1, n);
          double want = est > 0 ? o.seconds * 1e6 / est : o.max_iters;
          *it = want < o.min_iters ? o.min_iters : want > o.max_iters ? o.max_iters : (int)want;
          /* rank 0's count for all: every rank must make the same number of calls, and the
           * ranks' estimates need not agree to the last bit */
          MPI_Bcast(it, 1, MPI_INT, 0, MPI_COMM_WORLD);
        }
        for (size_t i = 0; i < recv; i++) r[i] = -1;
        t[(c * nsizes + k) * o.reps + rep] = timed(c, s, r, send, recv, *it, n);
        if (o.check) {
          long mine = wrong(c, r, send, recv, n, rank), all = 0;
          MPI_Allreduce(&mine, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
          bad[c * nsizes + k] += all;
        }
      }
    }
  }
  long total_bad = 0;
  for (int c = 0; c < NCOLL && rank == 0; c++) {
    if (!o.colls[c]) continue;
    double f = c == ALLREDUCE ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
    printf("# op=%s busbw factor=%.4f reps=%d (time = median over reps, tmin = best rep)\n",
           coll_name[c], f, o.reps);
    printf("%12s %12s %6s %5s %7s %12s %12s %10s %10s %8s\n", "size(B)", "count", "type", "redop",
           "iters", "time(us)", "tmin(us)", "algbw", "busbw", "#wrong");
    double b = (double)o.min_bytes;
    for (int k = 0; k < nsizes; k++, b *= o.factor) {
      size_t send, recv;
      counts(c, (long long)b, n, &send, &recv);
      if (send == 0 || recv == 0) continue;
      double *v = &t[(c * nsizes + k) * o.reps];
      qsort(v, o.reps, sizeof *v, by_value);
      double med = o.reps % 2 ? v[o.reps / 2] : (v[o.reps / 2 - 1] + v[o.reps / 2]) / 2;
      long long bytes = (long long)(c == ALLREDUCE ? send : c == ALLGATHER ? recv : send) * 4;
      double algbw = med > 0 ? bytes / med / 1e3 : 0;
      printf("%12lld %12zu %6s %5s %7d %12.2f %12.2f %10.3f %10.3f %8ld\n", bytes,
             c == ALLREDUCE ? send : c == ALLGATHER ? recv : send, "float", "sum",
             iters[c * nsizes + k], med, v[0], algbw, algbw * f, bad[c * nsizes + k]);
      total_bad += bad[c * nsizes + k];
    }
  }
  MPI_Bcast(&total_bad, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  free(s), free(r), free(t), free(iters), free(bad);
  MPI_Finalize();
  return total_bad ? 1 : 0;
}
