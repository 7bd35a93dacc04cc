// The C API as the compiled backend calls it: function pointers resolved from the copy of
// the library that the Python side (fabricoll._capi) already loaded, so that both sides use
// one library and one set of communicators. The declarations come from include/fabricoll.h.
#pragma once

#include <string>

#include "fabricoll.h"

namespace fabricoll_ext {

struct Api {
  decltype(&fabricoll_allreduce) allreduce;
  decltype(&fabricoll_iallreduce) iallreduce;
  decltype(&fabricoll_iallgather) iallgather;
  decltype(&fabricoll_ireducescatter) ireducescatter;
  decltype(&fabricoll_ibroadcast) ibroadcast;
  decltype(&fabricoll_igather) igather;
  decltype(&fabricoll_ibarrier) ibarrier;
  decltype(&fabricoll_isend_tagged) isend_tagged;
  decltype(&fabricoll_irecv_tagged) irecv_tagged;
  decltype(&fabricoll_wait) wait;
  // The stream-ordered calls, for CUDA tensors (stream_work.h).
  decltype(&fabricoll_allreduce_stream) allreduce_stream;
  decltype(&fabricoll_allgather_stream) allgather_stream;
  decltype(&fabricoll_reducescatter_stream) reducescatter_stream;
  decltype(&fabricoll_broadcast_stream) broadcast_stream;
  decltype(&fabricoll_reduce_stream) reduce_stream;
  decltype(&fabricoll_alltoall_stream) alltoall_stream;
  decltype(&fabricoll_gather_stream) gather_stream;
  decltype(&fabricoll_send_tagged_stream) send_tagged_stream;
  decltype(&fabricoll_recv_tagged_stream) recv_tagged_stream;
  decltype(&fabricoll_comm_get_async_error) comm_get_async_error;
  decltype(&fabricoll_request_notify) request_notify;
  decltype(&fabricoll_last_error) last_error;
  decltype(&fabricoll_status_string) status_string;
};

// Resolve the functions from the library already loaded from `path` (dlopen with
// RTLD_NOLOAD: never a second copy). Throws std::runtime_error naming what is missing.
// Idempotent for one path; a different path than the first is refused.
void attach(const std::string& path);

// The resolved functions (attach must have succeeded).
const Api& api();

// "fabricoll <op>: <function> failed: <STATUS> (<n>): <last error>", as the Python side
// words a failure. Call in the failing thread, right after the call.
std::string failure(const char* op, const char* function, int status);

}  // namespace fabricoll_ext
