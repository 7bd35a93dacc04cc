/*
 * harness_common.c: the ABI-independent helpers every C harness links (see harness_common.h):
 * strings, the error accumulator, signal names, gdb stacks, fd and RSS counts, byte patterns.
 */
#include "harness_common.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------ strings */

void copy_str(char* dst, size_t cap, const char* src) {
  size_t n = strlen(src);
  if (n >= cap) n = cap - 1;
  memcpy(dst, src, n);
  dst[n] = 0;
}

void append(char* dst, size_t cap, const char* fmt, ...) {
  size_t used = strlen(dst);
  if (used + 1 >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(dst + used, cap - used, fmt, ap);
  va_end(ap);
}

int in_list(const char* list, const char* name) {
  if (!list) return 0;
  size_t n = strlen(name);
  for (const char* p = list; *p;) {
    const char* q = strchr(p, ',');
    size_t len = q ? (size_t)(q - p) : strlen(p);
    if (len == n && strncmp(p, name, n) == 0) return 1;
    if (!q) break;
    p = q + 1;
  }
  return 0;
}

int unknown_scenario(const char* prog, const char* list, const void* table, size_t stride, int n) {
  for (const char* p = list; *p;) {
    const char* q = strchr(p, ',');
    size_t l = q ? (size_t)(q - p) : strlen(p);
    int found = 0;
    for (int i = 0; i < n && !found; i++) {
      const char* name = *(const char* const*)((const char*)table + (size_t)i * stride);
      found = strlen(name) == l && strncmp(name, p, l) == 0;
    }
    if (!found) {
      fprintf(stderr, "%s: --scenario: unknown scenario '%.*s'\n", prog, (int)l, p);
      return 1;
    }
    if (!q) break;
    p = q + 1;
  }
  return 0;
}

void warn_missing_lib(const char* prog, const char* path) {
  struct stat st;
  if (stat(path, &st) != 0)
    fprintf(stderr, "%s: warning: library %s: %s (every scenario will fail at dlopen)\n", prog, path, strerror(errno));
}

void add_err(errs_t* e, const char* fmt, ...) {
  char b[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  fprintf(stderr, "  problem: %s\n", b);
  e->count++;
  size_t used = strlen(e->text);
  if (used + 8 >= sizeof e->text) return;
  snprintf(e->text + used, sizeof e->text - used, "%s%s", used ? "; " : "", b);
}

/* --------------------------------------------------------------------------------- processes */

const char* signame(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGABRT: return "SIGABRT";
    case SIGKILL: return "SIGKILL";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    case SIGPIPE: return "SIGPIPE";
    case SIGTERM: return "SIGTERM";
    default: return "signal";
  }
}

void dump_stacks(const char* scn, int rank, pid_t pid) {
  const char* no = getenv("HARNESS_NO_STACKS");
  if ((no && *no && strcmp(no, "0") != 0) || access("/usr/bin/gdb", X_OK) != 0) return;
  char cmd[256];
  fprintf(stderr, "---- %s rank %d (pid %d) hung: stacks ----\n", scn, rank, (int)pid);
  fflush(NULL);
  snprintf(cmd, sizeof cmd,
           "timeout 30 /usr/bin/gdb -p %d -batch -nx -ex 'set pagination off' -ex 'thread apply all bt 30' "
           "</dev/null 2>/dev/null | grep -E '^(Thread|#)' >&2",
           (int)pid);
  if (system(cmd) != 0) fprintf(stderr, "(gdb could not attach)\n");
  fprintf(stderr, "---- end of stacks ----\n");
}

int count_fds(void) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1; /* the directory itself */
}

long rss_bytes(void) {
  FILE* f = fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long size = 0, res = 0;
  if (fscanf(f, "%ld %ld", &size, &res) != 2) res = -1;
  fclose(f);
  return res < 0 ? -1 : res * sysconf(_SC_PAGESIZE);
}

/* ----------------------------------------------------------------------------- byte patterns */

uint64_t seed_of(uint64_t a, uint64_t b, uint64_t c) {
  return mix64(mix64(a + 0x1234567ULL) ^ mix64(b * 3 + 0x51ULL) * 31 ^ mix64(c * 7 + 0x77ULL)) | 1;
}

void pat_fill_at(void* buf, size_t len, uint64_t seed, size_t off) {
  uint8_t* p = buf;
  size_t i = 0;
  while (i < len && (off + i) % 8) p[i] = pat_byte(seed, off + i), i++;
  for (; i + 8 <= len; i += 8) {
    uint64_t w = pat_word(seed, (off + i) / 8);
    memcpy(p + i, &w, 8);
  }
  for (; i < len; i++) p[i] = pat_byte(seed, off + i);
}

void pat_fill(void* buf, size_t len, uint64_t seed) { pat_fill_at(buf, len, seed, 0); }

long pat_check_at(const void* buf, size_t len, uint64_t seed, size_t off, size_t* nbad) {
  const uint8_t* p = buf;
  long first = -1;
  size_t bad = 0;
  for (size_t i = 0; i < len; i++) {
    if ((off + i) % 8 == 0 && i + 8 <= len) { /* whole words first: the byte loop is slow */
      uint64_t w = pat_word(seed, (off + i) / 8), g;
      memcpy(&g, p + i, 8);
      if (g == w) {
        i += 7;
        continue;
      }
    }
    if (p[i] != pat_byte(seed, off + i)) {
      if (first < 0) first = (long)i;
      bad++;
    }
  }
  if (nbad) *nbad = bad;
  return first;
}

long pat_check(const void* buf, size_t len, uint64_t seed, size_t* nbad) { return pat_check_at(buf, len, seed, 0, nbad); }
