// A torch c10d backend that does nothing: its all_reduce returns a completed Work. Built by
// overhead.py to measure torch's own dispatch of a C++ backend (the floor under fabricoll's
// compiled front).
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>

namespace {

class DoneWork : public c10d::Work {
 public:
  explicit DoneWork(std::vector<at::Tensor> out) : out_(std::move(out)) {}
  bool isCompleted() override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto f = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
    f->markCompleted(c10::IValue(out_));
    return f;
  }

 private:
  std::vector<at::Tensor> out_;
};

class NullBackend : public c10d::Backend {
 public:
  NullBackend(int rank, int size) : c10d::Backend(rank, size) {}
  const std::string getBackendName() const override { return "null"; }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& t,
                                           const c10d::AllreduceOptions&) override {
    return c10::make_intrusive<DoneWork>(t);
  }
};

}  // namespace

PYBIND11_MODULE(fabricoll_null_backend, m) {
  pybind11::class_<NullBackend, c10d::Backend, c10::intrusive_ptr<NullBackend>>(m, "NullBackend")
      .def(pybind11::init<int, int>());
}
