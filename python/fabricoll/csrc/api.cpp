// Resolving the C API from the loaded library (see api.h).
#include "api.h"

#include <dlfcn.h>

#include <mutex>
#include <stdexcept>

namespace fabricoll_ext {
namespace {

Api g_api;
std::string g_path;
std::mutex g_mu;

template <typename F>
void resolve(void* handle, const char* name, F& slot) {
  void* sym = dlsym(handle, name);
  if (sym == nullptr) {
    throw std::runtime_error(std::string("fabricoll._c10d: the library ") + g_path +
                             " does not export " + name + " (rebuild it)");
  }
  slot = reinterpret_cast<F>(sym);
}

}  // namespace

void attach(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_path.empty()) {
    if (path != g_path) {
      throw std::runtime_error("fabricoll._c10d: attached to " + g_path + ", not " + path);
    }
    return;
  }
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) {
    throw std::runtime_error("fabricoll._c10d: " + path +
                             " is not loaded in this process (load it through "
                             "fabricoll._capi first)");
  }
  g_path = path;
  Api a{};
  try {
    resolve(handle, "fabricoll_allreduce", a.allreduce);
    resolve(handle, "fabricoll_iallreduce", a.iallreduce);
    resolve(handle, "fabricoll_iallgather", a.iallgather);
    resolve(handle, "fabricoll_ireducescatter", a.ireducescatter);
    resolve(handle, "fabricoll_ibroadcast", a.ibroadcast);
    resolve(handle, "fabricoll_igather", a.igather);
    resolve(handle, "fabricoll_ibarrier", a.ibarrier);
    resolve(handle, "fabricoll_isend_tagged", a.isend_tagged);
    resolve(handle, "fabricoll_irecv_tagged", a.irecv_tagged);
    resolve(handle, "fabricoll_wait", a.wait);
    resolve(handle, "fabricoll_allreduce_stream", a.allreduce_stream);
    resolve(handle, "fabricoll_allgather_stream", a.allgather_stream);
    resolve(handle, "fabricoll_reducescatter_stream", a.reducescatter_stream);
    resolve(handle, "fabricoll_broadcast_stream", a.broadcast_stream);
    resolve(handle, "fabricoll_reduce_stream", a.reduce_stream);
    resolve(handle, "fabricoll_alltoall_stream", a.alltoall_stream);
    resolve(handle, "fabricoll_gather_stream", a.gather_stream);
    resolve(handle, "fabricoll_send_tagged_stream", a.send_tagged_stream);
    resolve(handle, "fabricoll_recv_tagged_stream", a.recv_tagged_stream);
    resolve(handle, "fabricoll_comm_get_async_error", a.comm_get_async_error);
    resolve(handle, "fabricoll_request_notify", a.request_notify);
    resolve(handle, "fabricoll_last_error", a.last_error);
    resolve(handle, "fabricoll_status_string", a.status_string);
  } catch (...) {
    g_path.clear();
    throw;
  }
  // The handle stays open for the process's life: the library is never unloaded.
  g_api = a;
}

const Api& api() { return g_api; }

std::string failure(const char* op, const char* function, int status) {
  const char* name = g_api.status_string != nullptr ? g_api.status_string(status) : "?";
  const char* msg = g_api.last_error != nullptr ? g_api.last_error() : "";
  return std::string("fabricoll ") + op + ": " + function + " failed: " + name + " (" +
         std::to_string(status) + "): " + (msg != nullptr ? msg : "");
}

}  // namespace fabricoll_ext
