// The compiled front of the torch backend: a c10d::Backend that runs the hot operations
// (all_reduce, all_gather_into_tensor, reduce_scatter_tensor, broadcast, barrier, send and
// recv on plain CPU tensors) straight through the C API, and forwards everything else to the Python
// backend (fabricoll/_backend.py, through forward.h), which implements every operation and form
// on CPU tensors. On CUDA tensors (backend_cuda.cpp) the same operations, and reduce,
// gather_into_tensor, all_to_all_single with equal splits and the one-tensor list forms of
// all_gather and reduce_scatter, run in stream order on torch's current stream
// (stream_work.h); the other forms fail, naming themselves.
//
// Both sides use one communicator, owned by the Python backend; operations keep their
// issue order on it whichever side starts them. Shutting down either side detaches this
// one first, so that no call reaches a destroyed communicator.
//
// torch versions: the virtuals that every supported torch has (2.11's names: _allgather_base,
// _reduce_scatter_base, alltoall_base, allgather_into_tensor_coalesced,
// reduce_scatter_tensor_coalesced, ...) are always overridden; torch 2.15 routes its newer
// names (all_gather_single, ...) to them by default. The newer names, and gather_into_tensor
// (which 2.11 does not have at all), are overridden where the Backend.hpp compiled against
// declares them: python/setup.py reads the header and defines FABRICOLL_C10D_<NAME> for each.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "api.h"
#include "forward.h"
#include "stream_work.h"

namespace fabricoll_ext {

class Backend : public c10d::Backend {
 public:
  // `full`: the Python backend (owns `comm`, the communicator's handle; the GIL is held).
  // `timeout`: the group's, for the host waits of this side (a barrier after CUDA work).
  Backend(py::object full, fabricoll_comm* comm, int rank, int size,
          std::chrono::milliseconds timeout);

  // Stop using the communicator and the Python backend (which calls it before destroying
  // the communicator).
  void detach();

  const std::string getBackendName() const override { return "fabricoll"; }
  bool supportsCoalescing() const override { return true; }
  uint64_t getSequenceNumberForGroup() override;
  void setSequenceNumberForGroup() override {}

  // The fast paths, each falling back to the Python backend for what it does not take.
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
#ifdef FABRICOLL_C10D_ALL_GATHER_SINGLE
  c10::intrusive_ptr<c10d::Work> all_gather_single(at::Tensor& out, at::Tensor& in,
                                                   const c10d::AllgatherOptions& opts) override;
#endif
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions& opts) override;
#ifdef FABRICOLL_C10D_REDUCE_SCATTER_SINGLE
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(
      at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& opts) override;
#endif
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) override;
  // torch 2.15's trampoline for Python backends never forwards these two, so they run here
  // always (2.11 has no gather_into_tensor).
#ifdef FABRICOLL_C10D_GATHER_SINGLE
  c10::intrusive_ptr<c10d::Work> gather_single(at::Tensor& out, at::Tensor& in,
                                               const c10d::GatherOptions& opts) override;
#endif
#ifdef FABRICOLL_C10D_GATHER_INTO_TENSOR
  c10::intrusive_ptr<c10d::Work> gather_into_tensor(at::Tensor& out, at::Tensor& in,
                                                    const c10d::GatherOptions& opts) override;
#endif

  // Forwarded to the Python backend.
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outs,
                                           std::vector<at::Tensor>& ins,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outs, std::vector<at::Tensor>& ins,
      const c10d::AllgatherOptions& opts) override;
#ifdef FABRICOLL_C10D_ALL_GATHER_SINGLE_COALESCED
  c10::intrusive_ptr<c10d::Work> all_gather_single_coalesced(
      std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
      const c10d::AllgatherOptions& opts) override;
#endif
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outs,
                                        std::vector<at::Tensor>& ins,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outs,
                                         std::vector<std::vector<at::Tensor>>& ins,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outs,
                                                std::vector<std::vector<at::Tensor>>& ins,
                                                const c10d::ReduceScatterOptions& opts) override;
#ifdef FABRICOLL_C10D_REDUCE_SCATTER_SINGLE_COALESCED
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single_coalesced(
      std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
      const c10d::ReduceScatterOptions& opts) override;
#endif
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
      const c10d::ReduceScatterOptions& opts) override;
#ifdef FABRICOLL_C10D_ALL_TO_ALL_SINGLE
  c10::intrusive_ptr<c10d::Work> all_to_all_single(at::Tensor& out, at::Tensor& in,
                                                   std::vector<int64_t>& out_splits,
                                                   std::vector<int64_t>& in_splits,
                                                   const c10d::AllToAllOptions& opts) override;
#endif
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in,
                                               std::vector<int64_t>& out_splits,
                                               std::vector<int64_t>& in_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outs,
                                          std::vector<at::Tensor>& ins,
                                          const c10d::AllToAllOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  void abort() override;
  void shutdown() override;

 private:
  // The communicator for a fast path, or nullptr to fall back (coalescing, or detached).
  fabricoll_comm* fast_comm() const;
  // The Python backend, or an error naming `op` once shut down.
  PythonBackend& full(const char* op);
  // Start a tagged send or receive of a plain tensor, or fall back (null) to Python.
  c10::intrusive_ptr<c10d::Work> p2p(bool send, std::vector<at::Tensor>& tensors, int peer,
                                     int tag);
  // Count a collective started here (torch's sequence number).
  void started() { seq_.fetch_add(1, std::memory_order_relaxed); }
  // The Work of a non-blocking call that returned `rc` and `req` (raises naming `op` and
  // `function` when it failed to start).
  c10::intrusive_ptr<c10d::Work> issued(int rc, fabricoll_request* req, c10d::OpType type,
                                        const char* op, const char* function,
                                        std::vector<at::Tensor> result,
                                        std::vector<at::Tensor> keep,
                                        std::function<void()> finish = nullptr,
                                        bool collective = true);
  // Start `gather_into_tensor` (shared by the two names torch uses for it).
  c10::intrusive_ptr<c10d::Work> gather_flat(at::Tensor& out, at::Tensor& in,
                                             const c10d::GatherOptions& opts);
  c10::intrusive_ptr<c10d::Work> allgather_flat(at::Tensor& out, at::Tensor& in,
                                                const c10d::AllgatherOptions& opts);
  c10::intrusive_ptr<c10d::Work> reduce_scatter_flat(at::Tensor& out, at::Tensor& in,
                                                     const c10d::ReduceScatterOptions& opts);

  // -- CUDA tensors (backend_cuda.cpp) --
  // Whether `t`, or any of `tensors`, is a CUDA tensor (the operation then takes the CUDA
  // path).
  static bool on_cuda(const at::Tensor& t) { return t.defined() && t.device().is_cuda(); }
  static bool on_cuda(const std::vector<at::Tensor>& tensors);
  // Run `call(comm, stream)`, one stream-ordered C call named `function`, for `op` on
  // `device` (see Launch), with `used` the tensors it reads or writes, then `after` on the
  // current stream; its Work yields `result`. Raises naming `op` when it does not start.
  template <typename Call>
  c10::intrusive_ptr<c10d::Work> stream_op(c10d::OpType type, const char* op,
                                           const char* function, c10::Device device,
                                           std::vector<at::Tensor> used,
                                           std::vector<at::Tensor> result, Call call,
                                           std::function<void()> after = nullptr,
                                           bool collective = true);
  c10::intrusive_ptr<c10d::Work> cuda_allreduce(std::vector<at::Tensor>& tensors,
                                                const c10d::AllreduceOptions& opts);
  c10::intrusive_ptr<c10d::Work> cuda_allgather(at::Tensor& out, at::Tensor& in);
  c10::intrusive_ptr<c10d::Work> cuda_allgather_list(std::vector<std::vector<at::Tensor>>& outs,
                                                     std::vector<at::Tensor>& ins);
  c10::intrusive_ptr<c10d::Work> cuda_reduce_scatter_list(
      std::vector<at::Tensor>& outs, std::vector<std::vector<at::Tensor>>& ins,
      const c10d::ReduceScatterOptions& opts);
  c10::intrusive_ptr<c10d::Work> cuda_reduce_scatter(at::Tensor& out, at::Tensor& in,
                                                     const c10d::ReduceScatterOptions& opts);
  c10::intrusive_ptr<c10d::Work> cuda_broadcast(std::vector<at::Tensor>& tensors,
                                                const c10d::BroadcastOptions& opts);
  c10::intrusive_ptr<c10d::Work> cuda_reduce(std::vector<at::Tensor>& tensors,
                                             const c10d::ReduceOptions& opts);
  c10::intrusive_ptr<c10d::Work> cuda_gather(at::Tensor& out, at::Tensor& in,
                                             const c10d::GatherOptions& opts);
  c10::intrusive_ptr<c10d::Work> cuda_alltoall(at::Tensor& out, at::Tensor& in,
                                               const std::vector<int64_t>& out_splits,
                                               const std::vector<int64_t>& in_splits);
  c10::intrusive_ptr<c10d::Work> cuda_p2p(bool send, std::vector<at::Tensor>& tensors,
                                          int peer, int tag);

  PythonBackend full_;
  std::atomic<fabricoll_comm*> comm_;
  std::chrono::milliseconds timeout_;
  StreamOrder streams_;
  std::atomic<bool> coalescing_{false};
  std::atomic<uint64_t> seq_{0};
};

}  // namespace fabricoll_ext
