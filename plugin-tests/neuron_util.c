/*
 * neuron_util.c: the helpers of neuron_harness (see neuron_harness.h): the logger handed to init,
 * checked return codes (expect_rc, errs_finish) and the handle mailbox. Clocks, HARNESS_VERBOSE
 * and the polling back-off come from netapi.c; reporting, deadlines and barriers from
 * harness_run.c; byte patterns and fd/RSS counts from harness_common.c (all linked).
 */
#include "neuron_harness.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------- logger */

atomic_long log_calls, log_warns, log_no_net, log_bad;
char log_last_warn[512];

void nn_logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  atomic_fetch_add(&log_calls, 1);
  if (fmt == NULL || (int)level < NCCL_LOG_NONE || (int)level > NCCL_LOG_TRACE) {
    atomic_fetch_add(&log_bad, 1);
    if (fmt == NULL) return;
  }
  if (!(flags & NCCL_NET)) atomic_fetch_add(&log_no_net, 1);
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap); /* always format: bad varargs from the library crash here */
  va_end(ap);
  if (level == NCCL_LOG_WARN) {
    atomic_fetch_add(&log_warns, 1);
    copy_str(log_last_warn, sizeof log_last_warn, msg);
  }
  if (verbose())
    fprintf(stderr, "[lib-log pid %d lvl %d flags 0x%lx %s:%d] %s\n", (int)getpid(), (int)level, flags,
            file ? file : "(null)", line, msg);
}

/* ----------------------------------------------------------------------- checked return codes */

int g_logger_given;

void expect_rc(rctx_t* c, errs_t* e, const char* what, ncclResult_t got, ncclResult_t want, long w0) {
  c->hc.checks++;
  if (got != want) {
    add_err(e, "%s returned %d (%s), expected %d (%s)", what, (int)got, rstr(got), (int)want, rstr(want));
    return;
  }
  if (want == ncclSuccess || !g_logger_given) return;
  c->hc.checks++;
  if (atomic_load(&log_warns) == w0) add_err(e, "%s returned %s without logging a WARN line", what, rstr(got));
}

int errs_finish(rctx_t* c, errs_t* e, const char* scope) {
  if (e->count == 0) return 0;
  return failf(c, "%s: %d problem(s): %s", scope, e->count, e->text);
}

/* -------------------------------------------------------------------------------- mailbox */

void publish(rctx_t* c, int slot, unsigned seq, const void* data) {
  memcpy(c->shm->slot[c->hc.rank][slot].data, data, HSIZE);
  atomic_store_explicit(&c->shm->slot[c->hc.rank][slot].seq, seq, memory_order_release);
}

int fetch(rctx_t* c, int from, int slot, unsigned seq, void* out, const char* what) {
  int64_t deadline = op_deadline(c);
  int spins = 0;
  stagef(c, "waiting for %s (rank %d slot %d seq %u)", what, from, slot, seq);
  while (atomic_load_explicit(&c->shm->slot[from][slot].seq, memory_order_acquire) != seq) {
    if (check_abort(c)) return -1;
    if (now_ns() > deadline) return failf(c, "timed out waiting for %s from rank %d", what, from);
    backoff(&spins);
  }
  memcpy(out, c->shm->slot[from][slot].data, HSIZE);
  return 0;
}
