/*
 * two_ranks.c: size arguments and the parent's bounded wait of the two-rank benchmarks
 * (net_bench, tcp_streams, and bench_core's rma_raw and neuron_bench); see two_ranks.h.
 */
#include "two_ranks.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>

int two_ranks_parse_size(const char* s, size_t* out) {
  char* end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || v < 0) return -1;
  size_t mul = 1;
  if (*end == 'k' || *end == 'K') mul = 1024, end++;
  else if (*end == 'm' || *end == 'M') mul = 1024 * 1024, end++;
  else if (*end == 'g' || *end == 'G') mul = 1024UL * 1024 * 1024, end++;
  if (mul > 1 && *end == 'i') end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end) return -1;
  *out = (size_t)(v * (double)mul);
  return 0;
}

int two_ranks_fork(pid_t pid[2], int (*child)(int rank, void* arg), void* arg) {
  fflush(NULL);
  pid_t parent = getpid();
  for (int r = 0; r < 2; r++) {
    pid[r] = fork();
    if (pid[r] < 0) {
      perror("fork");
      if (r == 1) kill(pid[0], SIGKILL), waitpid(pid[0], NULL, 0);
      return -1;
    }
    if (pid[r] == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(3);
      exit(child(r, arg) == 0 ? 0 : 1);
    }
  }
  return 0;
}

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int two_ranks_wait(const pid_t pid[2], int64_t deadline_ns, atomic_int* abort_flag, const char* prog) {
  int status[2] = {0, 0}, exited[2] = {0, 0}, failed = 0;
  while (!exited[0] || !exited[1]) {
    for (int r = 0; r < 2; r++)
      if (!exited[r] && waitpid(pid[r], &status[r], WNOHANG) == pid[r]) {
        exited[r] = 1;
        if (!WIFEXITED(status[r]) || WEXITSTATUS(status[r]) != 0) {
          failed = 1;
          atomic_store(abort_flag, 1);
          if (WIFSIGNALED(status[r])) fprintf(stderr, "%s: rank %d died of signal %d\n", prog, r, WTERMSIG(status[r]));
        }
      }
    if (mono_ns() > deadline_ns) {
      fprintf(stderr, "%s: global deadline passed; killing ranks\n", prog);
      for (int r = 0; r < 2; r++)
        if (!exited[r]) kill(pid[r], SIGKILL), waitpid(pid[r], &status[r], 0), exited[r] = 1;
      failed = 1;
    }
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return failed;
}
