/*
 * two_ranks.h: what the two-rank benchmarks (net_bench, tcp_streams, bench_core's) share, forked from one
 * parent: size arguments and the parent's bounded wait for its ranks.
 */
#ifndef TWO_RANKS_H
#define TWO_RANKS_H
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* "64K", "1MiB", "8" -> bytes (K/M/G are powers of 1024, a trailing i or B is ignored); 0 or -1. */
int two_ranks_parse_size(const char* s, size_t* out);

/* Fork ranks 0 and 1 (stdio flushed first). Each child dies with the parent, runs
 * `child(rank, arg)` and exit()s 0 when it returned 0, else 1; it never returns. In the parent:
 * 0 with both pids in `pid`, or -1 if a fork failed (perror said why). */
int two_ranks_fork(pid_t pid[2], int (*child)(int rank, void* arg), void* arg);

/* Wait for both ranks until `deadline_ns` (CLOCK_MONOTONIC); a rank that fails or dies sets
 * `*abort_flag`, and at the deadline both are killed. Returns 1 if anything failed, else 0. */
int two_ranks_wait(const pid_t pid[2], int64_t deadline_ns, atomic_int* abort_flag, const char* prog);
#endif
