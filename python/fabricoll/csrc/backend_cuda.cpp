// The compiled front on CUDA tensors: each operation is one stream-ordered C call
// (fabricoll_<op>_stream) on torch's current stream (stream_work.h has the stream model).
// Tensors that are not dense are made dense on the stream first and copied back after, so
// every step stays in stream order. What has no stream-ordered form fails with an error
// naming the operation and the form (the Python backend takes host tensors only).
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "backend.h"
#include "convert.h"
#include "stream_work.h"

namespace fabricoll_ext {
namespace {

using c10d::OpType;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

// `t` itself when dense and contiguous, else a dense copy made on the current stream.
at::Tensor dense(const at::Tensor& t) { return t.contiguous().resolve_conj().resolve_neg(); }

// The one CUDA device of `tensors` (the undefined ones skipped); an error naming `op` where
// they are on several devices, on the host or not strided.
c10::Device device_of(const char* op, std::initializer_list<const at::Tensor*> tensors) {
  std::optional<c10::Device> device;
  for (const at::Tensor* t : tensors) {
    if (!t->defined()) continue;
    TORCH_CHECK(t->device().is_cuda(), "fabricoll ", op,
                ": the tensors must all be on one CUDA device, got one on ", t->device());
    TORCH_CHECK(t->layout() == at::kStrided, "fabricoll ", op, ": ", t->layout(),
                " tensors are not supported (dense ones only)");
    TORCH_CHECK(!device || *device == t->device(), "fabricoll ", op,
                ": the tensors must all be on one CUDA device, got ", *device, " and ",
                t->device());
    device = t->device();
  }
  TORCH_CHECK(device.has_value(), "fabricoll ", op, ": no tensor");
  return *device;
}

// How a reduction runs: the engine's datatype and op, and PREMUL_SUM's factor (applied on
// the stream before a sum).
struct Reduction {
  int dtype;
  int op;
  std::optional<c10::Scalar> scalar;
  at::Tensor tensor;

  // `x` scaled by the factor (a new tensor), or `x` itself without one.
  at::Tensor apply(const at::Tensor& x) const {
    if (tensor.defined()) return x.mul(tensor.to(x.device()));
    if (scalar) return x.mul(*scalar);
    return x;
  }
  bool scales() const { return tensor.defined() || scalar.has_value(); }
};

Reduction reduction(const char* op, at::ScalarType type, const c10d::ReduceOp& r) {
  auto dt = engine_dtype(type);
  TORCH_CHECK(dt.has_value(), "fabricoll ", op, ": dtype ", type,
              " is not supported on CUDA tensors");
  if (r.op_ == c10d::ReduceOp::PREMUL_SUM) {
    TORCH_CHECK(r.supplement_, "fabricoll ", op, ": PREMUL_SUM without its factor");
    // torch makes PREMUL_SUM only with this supplement (_make_nccl_premul_sum).
    const auto* s = static_cast<const c10d::NCCLPreMulSumSupplement*>(r.supplement_.get());
    Reduction red{*dt, FABRICOLL_SUM, std::nullopt, at::Tensor()};
    if (s->tensor_factor.defined()) {
      red.tensor = s->tensor_factor;
    } else {
      red.scalar = c10::Scalar(s->double_factor);
    }
    return red;
  }
  auto eop = engine_op(r, *dt);
  TORCH_CHECK(eop.has_value(), "fabricoll ", op, ": reduction op ", r.op_, " on ", type,
              " is not supported");
  return Reduction{*dt, *eop, std::nullopt, at::Tensor()};
}

// `big` and `small` (named so in errors): on one CUDA device, of one dtype, `big` with
// `size` times `small`'s elements. Returns the device.
c10::Device scaled_pair(const char* op, const at::Tensor& big, const char* big_name,
                        const at::Tensor& small, const char* small_name, int size) {
  c10::Device device = device_of(op, {&big, &small});
  TORCH_CHECK(big.scalar_type() == small.scalar_type(), "fabricoll ", op, ": the ", big_name,
              " is ", big.scalar_type(), ", the ", small_name, " ", small.scalar_type());
  TORCH_CHECK(big.numel() == small.numel() * size, "fabricoll ", op, ": the ", big_name, " has ",
              big.numel(), " elements, not ", size, " x the ", small_name, "'s ", small.numel());
  return device;
}

// A list form's tensors (`what`: "input" or "output"): one per rank, each with the dtype,
// element count and device of `like`.
void check_list(const char* op, const std::vector<at::Tensor>& list, const at::Tensor& like,
                int size, const char* what) {
  TORCH_CHECK(list.size() == static_cast<size_t>(size), "fabricoll ", op, ": ", list.size(), " ",
              what, " tensors for a group of ", size);
  for (const at::Tensor& t : list) {
    device_of(op, {&t, &like});
    TORCH_CHECK(t.scalar_type() == like.scalar_type() && t.numel() == like.numel(), "fabricoll ",
                op, ": every ", what, " must have ", like.numel(), " elements of ",
                like.scalar_type(), ", got ", t.numel(), " of ", t.scalar_type());
  }
}

// After the operation: copy `from` into `to` on the current stream where they differ.
std::function<void()> copy_back(const at::Tensor& to, const at::Tensor& from) {
  if (to.is_same(from)) return nullptr;
  return [to, from]() mutable { to.copy_(from); };
}

}  // namespace

bool Backend::on_cuda(const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& t : tensors) {
    if (on_cuda(t)) return true;
  }
  return false;
}

template <typename Call>
WorkPtr Backend::stream_op(OpType type, const char* op, const char* function, c10::Device device,
                           std::vector<at::Tensor> used, std::vector<at::Tensor> result,
                           Call call, std::function<void()> after, bool collective) {
  fabricoll_comm* comm = comm_.load();
  TORCH_CHECK(comm != nullptr, "fabricoll ", op,
              ": the communicator is shut down (shutdown or abort)");
  TORCH_CHECK(!coalescing_.load(), "fabricoll ", op,
              ": CUDA tensors are not supported in a coalescing block");
  Launch at(device, [&] { return streams_.side(device); });
  record_on(at.stream(), used);
  int rc = call(comm, at.handle());
  at.finish();
  if (rc != 0) fail(op, function, rc);
  if (collective) started();
  if (after) after();
  auto work = c10::make_intrusive<StreamWork>(rank_, type, op, comm, at, std::move(result));
  streams_.add(work->event());
  return work;
}

WorkPtr Backend::cuda_allreduce(std::vector<at::Tensor>& tensors,
                                const c10d::AllreduceOptions& opts) {
  const char* name = "allreduce";
  TORCH_CHECK(tensors.size() == 1, "fabricoll ", name, ": expects one tensor per call, got ",
              tensors.size());
  at::Tensor& t = tensors[0];
  c10::Device dev = device_of(name, {&t});
  Reduction red = reduction(name, t.scalar_type(), opts.reduceOp);
  at::Tensor buf = red.apply(dense(t));
  return stream_op(
      OpType::ALLREDUCE, name, "fabricoll_allreduce_stream", dev, {buf}, tensors,
      [&](fabricoll_comm* c, void* s) {
        return api().allreduce_stream(buf.data_ptr(), buf.data_ptr(), buf.numel(), red.dtype,
                                      red.op, c, s);
      },
      copy_back(t, buf));
}

WorkPtr Backend::cuda_allgather(at::Tensor& out, at::Tensor& in) {
  const char* name = "all_gather_into_tensor";
  c10::Device dev = scaled_pair(name, out, "output", in, "input", size_);
  at::Tensor src = dense(in), dst = dense(out);
  return stream_op(
      OpType::_ALLGATHER_BASE, name, "fabricoll_allgather_stream", dev, {src, dst}, {out},
      [&](fabricoll_comm* c, void* s) {
        return api().allgather_stream(src.data_ptr(), dst.data_ptr(), bytes(src),
                                      FABRICOLL_UINT8, c, s);
      },
      copy_back(out, dst));
}

WorkPtr Backend::cuda_allgather_list(std::vector<std::vector<at::Tensor>>& outs,
                                     std::vector<at::Tensor>& ins) {
  const char* name = "all_gather";
  TORCH_CHECK(ins.size() == 1 && outs.size() == 1, "fabricoll ", name,
              ": expects one tensor per call, got ", ins.size());
  at::Tensor& in = ins[0];
  std::vector<at::Tensor>& list = outs[0];
  check_list(name, list, in, size_, "output");
  c10::Device dev = device_of(name, {&in});
  at::Tensor src = dense(in);
  at::Tensor flat = at::empty({in.numel() * size_}, in.options());
  const int64_t n = in.numel();
  return stream_op(
      OpType::ALLGATHER, name, "fabricoll_allgather_stream", dev, {src, flat}, list,
      [&](fabricoll_comm* c, void* s) {
        return api().allgather_stream(src.data_ptr(), flat.data_ptr(), bytes(src),
                                      FABRICOLL_UINT8, c, s);
      },
      [list, flat, n]() mutable {
        for (size_t i = 0; i < list.size(); ++i) {
          list[i].copy_(flat.narrow(0, static_cast<int64_t>(i) * n, n).view(list[i].sizes()));
        }
      });
}

WorkPtr Backend::cuda_reduce_scatter_list(std::vector<at::Tensor>& outs,
                                          std::vector<std::vector<at::Tensor>>& ins,
                                          const c10d::ReduceScatterOptions& opts) {
  const char* name = "reduce_scatter";
  TORCH_CHECK(outs.size() == 1 && ins.size() == 1, "fabricoll ", name,
              ": expects one tensor per call, got ", outs.size());
  at::Tensor& out = outs[0];
  std::vector<at::Tensor>& list = ins[0];
  check_list(name, list, out, size_, "input");
  std::vector<at::Tensor> flat_parts;
  for (const at::Tensor& i : list) flat_parts.push_back(i.reshape({-1}));
  c10::Device dev = device_of(name, {&out});
  Reduction red = reduction(name, out.scalar_type(), opts.reduceOp);
  at::Tensor src = red.apply(dense(at::cat(flat_parts))), dst = dense(out);
  return stream_op(
      OpType::REDUCE_SCATTER, name, "fabricoll_reducescatter_stream", dev, {src, dst}, outs,
      [&](fabricoll_comm* c, void* s) {
        return api().reducescatter_stream(src.data_ptr(), dst.data_ptr(), dst.numel(),
                                          red.dtype, red.op, c, s);
      },
      copy_back(out, dst));
}

WorkPtr Backend::cuda_reduce_scatter(at::Tensor& out, at::Tensor& in,
                                     const c10d::ReduceScatterOptions& opts) {
  const char* name = "reduce_scatter_tensor";
  c10::Device dev = scaled_pair(name, in, "input", out, "output", size_);
  Reduction red = reduction(name, out.scalar_type(), opts.reduceOp);
  at::Tensor src = red.apply(dense(in)), dst = dense(out);
  return stream_op(
      OpType::_REDUCE_SCATTER_BASE, name, "fabricoll_reducescatter_stream", dev, {src, dst},
      {out},
      [&](fabricoll_comm* c, void* s) {
        return api().reducescatter_stream(src.data_ptr(), dst.data_ptr(), dst.numel(),
                                          red.dtype, red.op, c, s);
      },
      copy_back(out, dst));
}

WorkPtr Backend::cuda_broadcast(std::vector<at::Tensor>& tensors,
                                const c10d::BroadcastOptions& opts) {
  const char* name = "broadcast";
  TORCH_CHECK(tensors.size() == 1 && opts.rootTensor == 0, "fabricoll ", name,
              ": expects one tensor per call, got ", tensors.size());
  at::Tensor& t = tensors[0];
  c10::Device dev = device_of(name, {&t});
  at::Tensor buf = dense(t);
  return stream_op(
      OpType::BROADCAST, name, "fabricoll_broadcast_stream", dev, {buf}, tensors,
      [&](fabricoll_comm* c, void* s) {
        return api().broadcast_stream(buf.data_ptr(), buf.data_ptr(), bytes(buf),
                                      FABRICOLL_UINT8, static_cast<int>(opts.rootRank),
                                      c, s);
      },
      copy_back(t, buf));
}

WorkPtr Backend::cuda_reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  const char* name = "reduce";
  TORCH_CHECK(tensors.size() == 1 && opts.rootTensor == 0, "fabricoll ", name,
              ": expects one tensor per call, got ", tensors.size());
  at::Tensor& t = tensors[0];
  c10::Device dev = device_of(name, {&t});
  Reduction red = reduction(name, t.scalar_type(), opts.reduceOp);
  at::Tensor buf = red.apply(dense(t));
  const bool root = opts.rootRank == rank_;
  return stream_op(
      OpType::REDUCE, name, "fabricoll_reduce_stream", dev, {buf}, tensors,
      [&](fabricoll_comm* c, void* s) {
        return api().reduce_stream(buf.data_ptr(), root ? buf.data_ptr() : nullptr, buf.numel(),
                                   red.dtype, red.op, static_cast<int>(opts.rootRank),
                                   c, s);
      },
      root ? copy_back(t, buf) : nullptr);
}

WorkPtr Backend::cuda_gather(at::Tensor& out, at::Tensor& in, const c10d::GatherOptions& opts) {
  const char* name = "gather_into_tensor";
  const bool root = opts.rootRank == rank_;
  c10::Device dev = root ? scaled_pair(name, out, "root's output", in, "input", size_)
                         : device_of(name, {&in});
  at::Tensor src = dense(in), dst;
  if (root) dst = dense(out);
  std::vector<at::Tensor> used{src};
  if (root) used.push_back(dst);
  // Only the root has a result (the others' output may be anything, even on the host).
  std::vector<at::Tensor> result;
  if (root) result.push_back(out);
  return stream_op(
      OpType::GATHER, name, "fabricoll_gather_stream", dev, used, std::move(result),
      [&](fabricoll_comm* c, void* s) {
        return api().gather_stream(src.data_ptr(), root ? dst.data_ptr() : nullptr, bytes(src),
                                   FABRICOLL_UINT8, static_cast<int>(opts.rootRank),
                                   c, s);
      },
      root ? copy_back(out, dst) : nullptr);
}

WorkPtr Backend::cuda_alltoall(at::Tensor& out, at::Tensor& in,
                               const std::vector<int64_t>& out_splits,
                               const std::vector<int64_t>& in_splits) {
  const char* name = "all_to_all_single";
  c10::Device dev = device_of(name, {&out, &in});
  TORCH_CHECK(out.scalar_type() == in.scalar_type(), "fabricoll ", name, ": the output is ",
              out.scalar_type(), ", the input ", in.scalar_type());
  // Splits count rows of the first dimension; equal ones are the plain alltoall.
  const int64_t rows = in.dim() > 0 ? in.size(0) : 0;
  for (const auto* splits : {&in_splits, &out_splits}) {
    for (int64_t s : *splits) {
      TORCH_CHECK(splits->size() == static_cast<size_t>(size_) && s * size_ == rows, "fabricoll ",
                  name,
                  ": uneven splits are not supported on CUDA tensors (the C API's alltoallv "
                  "takes host memory only); equal splits or none are");
    }
  }
  TORCH_CHECK(in.numel() == out.numel() && in.numel() % size_ == 0, "fabricoll ", name,
              ": the input and output must have the same number of elements, a multiple of "
              "the group's size ",
              size_, ", got ", in.numel(), " and ", out.numel());
  at::Tensor src = dense(in), dst = dense(out);
  return stream_op(
      OpType::ALLTOALL_BASE, name, "fabricoll_alltoall_stream", dev, {src, dst}, {out},
      [&](fabricoll_comm* c, void* s) {
        return api().alltoall_stream(src.data_ptr(), dst.data_ptr(), bytes(src) / size_,
                                     FABRICOLL_UINT8, c, s);
      },
      copy_back(out, dst));
}

WorkPtr Backend::cuda_p2p(bool send, std::vector<at::Tensor>& tensors, int peer, int tag) {
  const char* name = send ? "send" : "recv";
  TORCH_CHECK(tensors.size() == 1, "fabricoll ", name, ": expects one tensor per call, got ",
              tensors.size());
  TORCH_CHECK(tag >= 0 && tag <= FABRICOLL_MAX_TAG, "fabricoll ", name, ": tag ", tag,
              " is out of range (0 ..= ", FABRICOLL_MAX_TAG, ")");
  at::Tensor& t = tensors[0];
  c10::Device dev = device_of(name, {&t});
  at::Tensor buf = dense(t);
  // Point-to-point does not count in torch's sequence number (a collective's).
  if (send) {
    return stream_op(
        OpType::SEND, name, "fabricoll_send_tagged_stream", dev, {buf}, tensors,
        [&](fabricoll_comm* c, void* s) {
          return api().send_tagged_stream(buf.data_ptr(), bytes(buf), FABRICOLL_UINT8, peer, tag,
                                          c, s);
        },
        nullptr, false);
  }
  return stream_op(
      OpType::RECV, name, "fabricoll_recv_tagged_stream", dev, {buf}, tensors,
      [&](fabricoll_comm* c, void* s) {
        return api().recv_tagged_stream(buf.data_ptr(), bytes(buf), FABRICOLL_UINT8, peer, tag,
                                        c, s);
      },
      copy_back(t, buf), false);
}

}  // namespace fabricoll_ext
