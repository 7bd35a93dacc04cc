// The compiled front of the torch backend (see backend.h).
#include "backend.h"

#include <c10/util/Exception.h>

#include "convert.h"
#include "work.h"

namespace fabricoll_ext {
namespace {

using c10d::OpType;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

}  // namespace

Backend::Backend(py::object full, fabricoll_comm* comm, int rank, int size,
                 std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size), full_(std::move(full)), comm_(comm), timeout_(timeout) {}

void Backend::detach() {
  comm_.store(nullptr);
  full_.release();
}

fabricoll_comm* Backend::fast_comm() const {
  return coalescing_.load(std::memory_order_relaxed) ? nullptr : comm_.load();
}

PythonBackend& Backend::full(const char* op) {
  TORCH_CHECK(comm_.load() != nullptr, "fabricoll ", op,
              ": the communicator is shut down (shutdown or abort)");
  return full_;
}

WorkPtr Backend::issued(int rc, fabricoll_request* req, c10d::OpType type, const char* op,
                        const char* function, std::vector<at::Tensor> result,
                        std::vector<at::Tensor> keep, std::function<void()> finish,
                        bool collective) {
  if (rc != 0) fail(op, function, rc);
  if (collective) started();
  return c10::make_intrusive<Work>(rank_, type, op, std::vector<fabricoll_request*>{req},
                                   std::move(result), std::move(keep), std::move(finish));
}

uint64_t Backend::getSequenceNumberForGroup() {
  return seq_.load() +
         full("getSequenceNumberForGroup").number("_get_sequence_number_for_group");
}

// -- fast paths ------------------------------------------------------------------------

WorkPtr Backend::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  if (on_cuda(tensors)) return cuda_allreduce(tensors, opts);
  fabricoll_comm* comm = fast_comm();
  if (comm != nullptr && tensors.size() == 1 && plain(tensors[0])) {
    at::Tensor& t = tensors[0];
    auto dt = engine_dtype(t.scalar_type());
    auto op = dt ? engine_op(opts.reduceOp, *dt) : std::nullopt;
    if (op) {
      void* p = t.data_ptr();
      if (!opts.asyncOp) {
        // torch waits at once and drops the Work without handing it to the caller: the
        // blocking call, and one shared completed Work (no allocation per call).
        int rc = api().allreduce(p, p, t.numel(), *dt, *op, comm);
        if (rc != 0) fail("allreduce", "fabricoll_allreduce", rc);
        started();
        static const c10::intrusive_ptr<Work> kDone =
            Work::done(-1, OpType::ALLREDUCE, "allreduce", {});
        return kDone;
      }
      fabricoll_request* req = nullptr;
      int rc = api().iallreduce(p, p, t.numel(), *dt, *op, comm, &req);
      return issued(rc, req, OpType::ALLREDUCE, "allreduce", "fabricoll_iallreduce", tensors, {t});
    }
  }
  return full("allreduce").work("allreduce", tensors, opts);
}

WorkPtr Backend::allgather_flat(at::Tensor& out, at::Tensor& in,
                                const c10d::AllgatherOptions& opts) {
  if (on_cuda(out) || on_cuda(in)) return cuda_allgather(out, in);
  fabricoll_comm* comm = fast_comm();
  if (comm != nullptr && plain(out) && plain(in) && out.scalar_type() == in.scalar_type() &&
      bytes(out) == bytes(in) * static_cast<size_t>(size_)) {
    fabricoll_request* req = nullptr;
    int rc = api().iallgather(in.data_ptr(), out.data_ptr(), bytes(in), FABRICOLL_UINT8, comm,
                              &req);
    return issued(rc, req, OpType::_ALLGATHER_BASE, "all_gather_into_tensor",
                  "fabricoll_iallgather", {out}, {out, in});
  }
  return full("all_gather_into_tensor").work("all_gather_single", out, in, opts);
}

#ifdef FABRICOLL_C10D_ALL_GATHER_SINGLE
WorkPtr Backend::all_gather_single(at::Tensor& out, at::Tensor& in,
                                   const c10d::AllgatherOptions& opts) {
  return allgather_flat(out, in, opts);
}
#endif

WorkPtr Backend::_allgather_base(at::Tensor& out, at::Tensor& in,
                                 const c10d::AllgatherOptions& opts) {
  return allgather_flat(out, in, opts);
}

WorkPtr Backend::reduce_scatter_flat(at::Tensor& out, at::Tensor& in,
                                     const c10d::ReduceScatterOptions& opts) {
  if (on_cuda(out) || on_cuda(in)) return cuda_reduce_scatter(out, in, opts);
  fabricoll_comm* comm = fast_comm();
  if (comm != nullptr && plain(out) && plain(in) && out.scalar_type() == in.scalar_type() &&
      in.numel() == out.numel() * size_) {
    auto dt = engine_dtype(out.scalar_type());
    auto op = dt ? engine_op(opts.reduceOp, *dt) : std::nullopt;
    if (op) {
      fabricoll_request* req = nullptr;
      int rc = api().ireducescatter(in.data_ptr(), out.data_ptr(), out.numel(), *dt, *op, comm,
                                    &req);
      return issued(rc, req, OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor",
                    "fabricoll_ireducescatter", {out}, {out, in});
    }
  }
  return full("reduce_scatter_tensor").work("reduce_scatter_single", out, in, opts);
}

#ifdef FABRICOLL_C10D_REDUCE_SCATTER_SINGLE
WorkPtr Backend::reduce_scatter_single(at::Tensor& out, at::Tensor& in,
                                       const c10d::ReduceScatterOptions& opts) {
  return reduce_scatter_flat(out, in, opts);
}
#endif

WorkPtr Backend::_reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                      const c10d::ReduceScatterOptions& opts) {
  return reduce_scatter_flat(out, in, opts);
}

WorkPtr Backend::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  if (on_cuda(tensors)) return cuda_broadcast(tensors, opts);
  fabricoll_comm* comm = fast_comm();
  if (comm != nullptr && tensors.size() == 1 && plain(tensors[0]) && opts.rootTensor == 0) {
    at::Tensor& t = tensors[0];
    void* p = t.data_ptr();
    fabricoll_request* req = nullptr;
    int rc = api().ibroadcast(p, p, bytes(t), FABRICOLL_UINT8, static_cast<int>(opts.rootRank),
                              comm, &req);
    return issued(rc, req, OpType::BROADCAST, "broadcast", "fabricoll_ibroadcast", tensors, {t});
  }
  return full("broadcast").work("broadcast", tensors, opts);
}

WorkPtr Backend::barrier(const c10d::BarrierOptions& opts) {
  // As NCCL's barrier: the operations on CUDA tensors issued so far have completed first.
  streams_.drain("barrier", timeout_);
  fabricoll_comm* comm = fast_comm();
  if (comm == nullptr) {
    return full("barrier").work("barrier", opts);
  }
  fabricoll_request* req = nullptr;
  int rc = api().ibarrier(comm, &req);
  return issued(rc, req, OpType::BARRIER, "barrier", "fabricoll_ibarrier", {}, {});
}

WorkPtr Backend::p2p(bool send, std::vector<at::Tensor>& tensors, int peer, int tag) {
  fabricoll_comm* comm = fast_comm();
  if (comm == nullptr || tensors.size() != 1 || !plain(tensors[0]) || tag < 0 ||
      tag > FABRICOLL_MAX_TAG) {
    return nullptr;  // the Python backend words the errors (tags out of range, several tensors)
  }
  at::Tensor& t = tensors[0];
  fabricoll_request* req = nullptr;
  // Point-to-point does not count in torch's sequence number (a collective's).
  if (send) {
    int rc = api().isend_tagged(t.data_ptr(), bytes(t), FABRICOLL_UINT8, peer, tag, comm, &req);
    return issued(rc, req, OpType::SEND, "send", "fabricoll_isend_tagged", tensors, {t},
                  nullptr, false);
  }
  int rc = api().irecv_tagged(t.data_ptr(), bytes(t), FABRICOLL_UINT8, peer, tag, comm, &req);
  return issued(rc, req, OpType::RECV, "recv", "fabricoll_irecv_tagged", tensors, {t}, nullptr,
                false);
}

WorkPtr Backend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  if (on_cuda(tensors)) return cuda_p2p(true, tensors, dst, tag);
  WorkPtr w = p2p(true, tensors, dst, tag);
  return w ? w : full("send").work("send", tensors, dst, tag);
}

WorkPtr Backend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  if (on_cuda(tensors)) return cuda_p2p(false, tensors, src, tag);
  WorkPtr w = p2p(false, tensors, src, tag);
  return w ? w : full("recv").work("recv", tensors, src, tag);
}

WorkPtr Backend::gather_flat(at::Tensor& out, at::Tensor& in, const c10d::GatherOptions& opts) {
  const char* name = "gather_into_tensor";
  if (on_cuda(out) || on_cuda(in)) return cuda_gather(out, in, opts);
  fabricoll_comm* comm = comm_.load();
  TORCH_CHECK(comm != nullptr, "fabricoll ", name,
              ": the communicator is shut down (shutdown or abort)");
  TORCH_CHECK(!coalescing_.load(), "fabricoll ", name, ": not supported in a coalescing block");
  TORCH_CHECK(in.device().is_cpu() && in.layout() == at::kStrided, "fabricoll ", name,
              ": CPU tensors only, got one on ", in.device());
  const bool root = opts.rootRank == rank_;
  at::Tensor src = in.contiguous().resolve_conj().resolve_neg();
  at::Tensor dst;
  std::function<void()> finish;
  if (root) {
    TORCH_CHECK(out.device().is_cpu() && out.layout() == at::kStrided, "fabricoll ", name,
                ": CPU tensors only, got one on ", out.device());
    TORCH_CHECK(out.scalar_type() == in.scalar_type(), "fabricoll ", name, ": the output is ",
                out.scalar_type(), ", the input ", in.scalar_type());
    TORCH_CHECK(bytes(out) == bytes(in) * static_cast<size_t>(size_), "fabricoll ", name,
                ": the root's output has ", out.numel(), " elements, not ", size_,
                " x the input's ", in.numel(), " (gather takes equal sizes)");
    if (plain(out)) {
      dst = out;
    } else {
      dst = at::empty_like(out, at::MemoryFormat::Contiguous);
      finish = [out, dst]() mutable { out.copy_(dst); };
    }
  }
  fabricoll_request* req = nullptr;
  int rc = api().igather(src.data_ptr(), root ? dst.data_ptr() : nullptr, bytes(src),
                         FABRICOLL_UINT8, static_cast<int>(opts.rootRank), comm, &req);
  std::vector<at::Tensor> keep{src};
  if (root) keep.push_back(dst);
  return issued(rc, req, OpType::GATHER, name, "fabricoll_igather", {out}, std::move(keep),
                std::move(finish));
}

#ifdef FABRICOLL_C10D_GATHER_SINGLE
WorkPtr Backend::gather_single(at::Tensor& out, at::Tensor& in, const c10d::GatherOptions& opts) {
  return gather_flat(out, in, opts);
}
#endif

#ifdef FABRICOLL_C10D_GATHER_INTO_TENSOR
WorkPtr Backend::gather_into_tensor(at::Tensor& out, at::Tensor& in,
                                    const c10d::GatherOptions& opts) {
  return gather_flat(out, in, opts);
}
#endif

// -- forwarded -------------------------------------------------------------------------

WorkPtr Backend::allreduce_sparse(std::vector<at::Tensor>& t, const c10d::AllreduceOptions& o) {
  return full("allreduce_sparse").work("allreduce_sparse", t, o);
}

WorkPtr Backend::allreduce_coalesced(std::vector<at::Tensor>& t,
                                     const c10d::AllreduceCoalescedOptions& o) {
  return full("allreduce_coalesced").work("allreduce_coalesced", t, o);
}

WorkPtr Backend::reduce(std::vector<at::Tensor>& t, const c10d::ReduceOptions& o) {
  if (on_cuda(t)) return cuda_reduce(t, o);
  return full("reduce").work("reduce", t, o);
}

WorkPtr Backend::allgather(std::vector<std::vector<at::Tensor>>& outs,
                           std::vector<at::Tensor>& ins, const c10d::AllgatherOptions& o) {
  if (on_cuda(ins) || (!outs.empty() && on_cuda(outs[0]))) return cuda_allgather_list(outs, ins);
  return full("allgather").work("allgather", outs, ins, o);
}

WorkPtr Backend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outs,
                                     std::vector<at::Tensor>& ins,
                                     const c10d::AllgatherOptions& o) {
  return full("allgather_coalesced").work("allgather_coalesced", outs, ins, o);
}

#ifdef FABRICOLL_C10D_ALL_GATHER_SINGLE_COALESCED
WorkPtr Backend::all_gather_single_coalesced(std::vector<at::Tensor>& outs,
                                             std::vector<at::Tensor>& ins,
                                             const c10d::AllgatherOptions& o) {
  return allgather_into_tensor_coalesced(outs, ins, o);
}
#endif

WorkPtr Backend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outs,
                                                 std::vector<at::Tensor>& ins,
                                                 const c10d::AllgatherOptions& o) {
  return full("all_gather_into_tensor_coalesced")
      .work("all_gather_single_coalesced", outs, ins, o);
}

WorkPtr Backend::gather(std::vector<std::vector<at::Tensor>>& outs, std::vector<at::Tensor>& ins,
                        const c10d::GatherOptions& o) {
  return full("gather").work("gather", outs, ins, o);
}

WorkPtr Backend::scatter(std::vector<at::Tensor>& outs, std::vector<std::vector<at::Tensor>>& ins,
                         const c10d::ScatterOptions& o) {
  return full("scatter").work("scatter", outs, ins, o);
}

WorkPtr Backend::reduce_scatter(std::vector<at::Tensor>& outs,
                                std::vector<std::vector<at::Tensor>>& ins,
                                const c10d::ReduceScatterOptions& o) {
  if (on_cuda(outs) || (!ins.empty() && on_cuda(ins[0]))) {
    return cuda_reduce_scatter_list(outs, ins, o);
  }
  return full("reduce_scatter").work("reduce_scatter", outs, ins, o);
}

#ifdef FABRICOLL_C10D_REDUCE_SCATTER_SINGLE_COALESCED
WorkPtr Backend::reduce_scatter_single_coalesced(std::vector<at::Tensor>& outs,
                                                 std::vector<at::Tensor>& ins,
                                                 const c10d::ReduceScatterOptions& o) {
  return reduce_scatter_tensor_coalesced(outs, ins, o);
}
#endif

WorkPtr Backend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outs,
                                                 std::vector<at::Tensor>& ins,
                                                 const c10d::ReduceScatterOptions& o) {
  return full("reduce_scatter_tensor_coalesced")
      .work("reduce_scatter_single_coalesced", outs, ins, o);
}

#ifdef FABRICOLL_C10D_ALL_TO_ALL_SINGLE
WorkPtr Backend::all_to_all_single(at::Tensor& out, at::Tensor& in,
                                   std::vector<int64_t>& out_splits,
                                   std::vector<int64_t>& in_splits,
                                   const c10d::AllToAllOptions& o) {
  return alltoall_base(out, in, out_splits, in_splits, o);
}
#endif

WorkPtr Backend::alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                               std::vector<int64_t>& in_splits, const c10d::AllToAllOptions& o) {
  if (on_cuda(out) || on_cuda(in)) return cuda_alltoall(out, in, out_splits, in_splits);
  return full("all_to_all_single").work("all_to_all_single", out, in, out_splits, in_splits, o);
}

WorkPtr Backend::alltoall(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
                          const c10d::AllToAllOptions& o) {
  return full("alltoall").work("alltoall", outs, ins, o);
}

void Backend::monitoredBarrier(const c10d::BarrierOptions& o, bool wait_all_ranks) {
  full("monitored_barrier").call("monitored_barrier", o, wait_all_ranks);
}

WorkPtr Backend::recvAnysource(std::vector<at::Tensor>& t, int tag) {
  return full("recv_anysource").work("recv_anysource", t, tag);
}

void Backend::startCoalescing() {
  full("start_coalescing").call("start_coalescing");
  coalescing_.store(true);
}

WorkPtr Backend::endCoalescing() {
  coalescing_.store(false);
  return full("end_coalescing").work("end_coalescing");
}

void Backend::abort() {
  // After shutdown there is nothing left to abort (as the Python backend: a no-op).
  if (comm_.load() != nullptr) full_.call("abort");
}

void Backend::shutdown() {
  if (comm_.exchange(nullptr) != nullptr) {
    full_.last_call("shutdown");
  }
}

}  // namespace fabricoll_ext
