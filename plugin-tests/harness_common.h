/*
 * harness_common.h: helpers the C harnesses share (net_harness, collnet_harness and
 * neuron_harness), none of which depends on a plugin ABI: buffer sizes of the reports, string
 * helpers, the error accumulator, scenario-list matching, signal names and stacks of a hung rank
 * (gdb), the byte patterns transfers are filled with and checked against, and fd and RSS counts.
 * Defined in harness_common.c, linked into each harness.
 */
#ifndef FABRICOLL_TEST_HARNESS_COMMON_H
#define FABRICOLL_TEST_HARNESS_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define STAGE_LEN 256   /* what a rank is doing, for timeout reports */
#define FAIL_LEN 2048   /* a rank's first failure message */
#define DETAIL_LEN 1024 /* what a rank reports on success */
#define MIB (1024UL * 1024UL)

/* ------------------------------------------------------------------------------------ strings */

/* Copies src into dst[cap], truncating; always terminated. */
void copy_str(char* dst, size_t cap, const char* src);
/* Appends a formatted string to the terminated string in dst[cap], truncating. */
void append(char* dst, size_t cap, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
/* Whether `name` is one of the comma-separated names of `list` (NULL: no). */
int in_list(const char* list, const char* name);

/* Whether the comma-separated `list` (--scenario) holds a name that no entry of `table` has (n
 * entries, `stride` bytes apart, each starting with its `const char* name`); the first such name
 * is reported on stderr as `prog`'s. */
int unknown_scenario(const char* prog, const char* list, const void* table, size_t stride, int n);
/* Warns on stderr, as `prog`, when the plugin file `path` cannot be found (every scenario will then
 * fail at dlopen). */
void warn_missing_lib(const char* prog, const char* path);

/* An error accumulator for scenarios that report every problem they find, not only the first. */
typedef struct {
  char text[FAIL_LEN];
  int count;
} errs_t;
/* Counts a problem, prints it to stderr and appends it to e->text ("; "-separated). */
void add_err(errs_t* e, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

/* --------------------------------------------------------------------------------- processes */

/* The name of a signal a rank died of ("signal" for the unusual ones). */
const char* signame(int sig);
/* Stack traces of a hung rank (gdb, if installed) to stderr, before it is killed; set
 * HARNESS_NO_STACKS=1 to skip. The parent never loaded the plugin, so it can run gdb freely. */
void dump_stacks(const char* scn, int rank, pid_t pid);
/* Open file descriptors of this process (the directory read to count them not included); -1 on error. */
int count_fds(void);
/* Resident set size of this process in bytes; -1 on error. */
long rss_bytes(void);

/* ---------------------------------------------------------------- clock, logging, back-off */

/* Defined in netapi.c (ABI-free; linked into every harness): CLOCK_MONOTONIC ns, milliseconds
 * since t0, HARNESS_VERBOSE and logging under it, and the polling back-off (spin first, then
 * yield, then sleep briefly: 2 cores shared by up to 4 ranks). */
int64_t now_ns(void);
double ms_since(int64_t t0);
int verbose(void);
void vlog(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void backoff(int* spins);

/* ----------------------------------------------------------------------------- byte patterns */

/* A 64-bit mixer (splitmix64's finaliser): the source of every pattern and seed. */
static inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

/* A seed from three numbers (scenario, size, rank, ...); never 0. */
uint64_t seed_of(uint64_t a, uint64_t b, uint64_t c);

/* Word w (bytes 8w to 8w+7) of the pattern with seed `seed`; one hash per 8 bytes. */
static inline uint64_t pat_word(uint64_t seed, uint64_t w) { return mix64(seed * 0x9E3779B97F4A7C15ULL + w); }
/* The byte at offset `off` of the pattern. */
static inline uint8_t pat_byte(uint64_t seed, size_t off) {
  return (uint8_t)(pat_word(seed, off / 8) >> (8 * (off % 8)));
}

void pat_fill(void* buf, size_t len, uint64_t seed);
/* The pattern as it would be at offset `off` of a buffer filled with pat_fill(seed). */
void pat_fill_at(void* buf, size_t len, uint64_t seed, size_t off);
/* The first offset that differs from the pattern, or -1; *nbad (if not NULL) gets how many bytes differ. */
long pat_check(const void* buf, size_t len, uint64_t seed, size_t* nbad);
long pat_check_at(const void* buf, size_t len, uint64_t seed, size_t off, size_t* nbad);

#endif
