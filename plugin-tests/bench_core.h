/*
 * bench_core.h: the measuring loops shared by rma_raw (libfabric directly) and neuron_bench (the
 * Neuron plugin's table), so that both sides of a plugin/raw ratio are timed by the same code.
 *
 * A backend supplies `post` and `test` over its own buffers (a send buffer and a receive buffer
 * of every rank, each `max + BENCH_CTL_BYTES` bytes, registered for local and remote access);
 * the engine forks two ranks, runs the size sweep and prints, on rank 0, one row per size and op:
 *   #  size(B)     op      lat_us       GBps
 *   %10zu %6s %11.3f %10.4f
 * lat_us: one op in flight, `iters` ops back to back, elapsed / iters (for send: one-way
 * latency of a ping-pong, elapsed / (2 * iters)). GBps: WINDOW ops in flight, size * n / elapsed
 * (GB = 1e9 B; for send: rank 0 streams, timed until rank 1 acknowledges the last message).
 * One-sided ops (write, read, inline) are issued by rank 0 only; rank 1 keeps its endpoint
 * progressing by waiting on a control receive that rank 0 completes after each (size, op).
 */
#ifndef FABRICOLL_TEST_BENCH_CORE_H
#define FABRICOLL_TEST_BENCH_CORE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define BENCH_MAXSIZES 64
#define BENCH_MAXWINDOW 128
#define BENCH_CTL_BYTES 64 /* control messages use the last 64 bytes of each buffer */
#define BENCH_XCHG_BYTES 512

/* What a backend posts. CTL_SEND / CTL_RECV move 1 byte at the control offset of the send /
 * receive buffer; the others move `size` bytes from offset 0. */
enum bench_op { BOP_SEND, BOP_RECV, BOP_WRITE, BOP_READ, BOP_INLINE, BOP_CTL_SEND, BOP_CTL_RECV };

typedef struct bench bench_t;

typedef struct {
  /* Post one op: 0 posted (*tok set), 1 busy (call again), -1 failed (after bench_fail). */
  int (*post)(bench_t* b, enum bench_op op, size_t size, void** tok);
  /* Check a posted op: 0 with *done (and *bytes when done), -1 failed. A done token is spent. */
  int (*test)(bench_t* b, void* tok, int* done, size_t* bytes);
} bench_ops_t;

typedef struct {
  size_t min, max, factor;
  size_t list[BENCH_MAXSIZES]; /* -s: explicit sizes instead of min..max */
  int nlist;
  double secs; /* target seconds per (size, op), split between latency and bandwidth */
  int window;
  long long timeout_ms; /* deadline of every single wait */
} bench_cfg_t;

struct bench_shm {
  atomic_int abort;
  atomic_uint xseq[2], xack[2]; /* exchanges published / copied by each rank */
  unsigned char xchg[2][BENCH_XCHG_BYTES];
  atomic_llong iters[BENCH_MAXSIZES][8][2]; /* rank 0's iteration counts, shared for send */
  char fail[2][1024];
};

struct bench {
  int rank;
  struct bench_shm* shm;
  const bench_cfg_t* cfg;
  const bench_ops_t* ops;
  void* ctx; /* the backend's */
  unsigned char *sbuf, *rbuf; /* from bench_alloc, freed by bench_fork after rank_main */
  size_t cap;                 /* their size: cfg->max + BENCH_CTL_BYTES */
};

int64_t bench_now_ns(void);
/* The two page-aligned buffers (send filled with 0x5A, receive zeroed). 0 or -1. */
int bench_alloc(bench_t* b);
int bench_fail(bench_t* b, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
int bench_aborted(bench_t* b);
const char* bench_op_name(enum bench_op op);

/* Publish `len` bytes and wait (deadline) for the peer's; each rank calls it the same number
 * of times with the same `len`. 0 or -1. */
int bench_exchange(bench_t* b, const void* mine, size_t len, void* peer);

/* Post (retrying while busy) / wait for completion, both bounded by cfg->timeout_ms. */
int bench_post(bench_t* b, enum bench_op op, size_t size, void** tok, const char* what);
int bench_wait(bench_t* b, void* tok, size_t* bytes, const char* what);

/* Checks that one-sided ops move the right bytes: rank 0 reads 64 B of rank 1's send buffer
 * (when `read`) and writes 64 B into rank 1's receive buffer (when `write`). 0 or -1. */
int bench_verify(bench_t* b, int read, int write);

/* The sweep over the configured sizes for each op of `ops` (BOP_SEND, BOP_WRITE, BOP_READ,
 * BOP_INLINE); op i is measured only up to size limit[i]. Prints rows on rank 0. 0 or -1. */
int bench_sweep(bench_t* b, const enum bench_op* ops, const size_t* limit, int nops);

/* What a rank does once connected: bench_verify of the one-sided ops among `ops`, bench_sweep,
 * and a last exchange, so that neither rank closes while the other still uses its endpoint. */
int bench_run(bench_t* b, const enum bench_op* ops, const size_t* limit, int nops);

/* Parse "-o" lists like "write,read": each name (bench_op_name) must be one of `allowed`; at
 * most `max` of them. Returns the count, or -1 (having printed why, naming -o). */
int bench_parse_ops(const char* prog, const char* list, const enum bench_op* allowed, int nallowed,
                    enum bench_op* out, int max);

/* Parse the common options (-b -e -f -s -t -w --timeout-ms) into cfg; `extra` handles the
 * others, given the next argument or NULL: it returns how many values it took (0 or 1), or -1
 * when the option or its value is bad, having printed why. Returns 0, or 2 on a bad command
 * line (usage printed), or 1 when -h asked only for the usage. */
int bench_parse(int argc, char** argv, bench_cfg_t* cfg, const char* prog, const char* usage,
                int (*extra)(const char* opt, const char* val));

/* Fork two ranks that each run rank_main on a fresh bench_t (rank, shm, cfg set; ops and ctx
 * for rank_main to fill), wait for both under a global deadline, print failures. Exit status. */
int bench_fork(const bench_cfg_t* cfg, const char* prog, int (*rank_main)(bench_t* b));

#endif
