// fabricoll._c10d: the compiled front of the torch backend, as a Python module (built by
// python/setup.py when torch is importable; fabricoll/torch.py uses it when it loads).
#include <torch/csrc/utils/pybind.h>

#include "api.h"
#include "backend.h"

namespace py = pybind11;
using fabricoll_ext::Backend;

PYBIND11_MODULE(_c10d, m) {
  m.doc() = "The compiled front of fabricoll's torch backend (fabricoll.torch uses it).";
  m.def("attach", &fabricoll_ext::attach, py::arg("path"),
        "Use the fabricoll library already loaded from `path` (fabricoll._capi's).");
  // torch 2.15's ReduceOp shows PREMUL_SUM's factor to Python (`factor`); 2.11's does not,
  // so the Python backend reads it here.
  m.def(
      "premul_factor",
      [](const c10d::ReduceOp& op) -> py::object {
        if (op.op_ != c10d::ReduceOp::PREMUL_SUM || !op.supplement_) return py::none();
        // torch makes PREMUL_SUM only with this supplement (_make_nccl_premul_sum).
        const auto* s = static_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
        if (s->tensor_factor.defined()) return py::cast(s->tensor_factor);
        return py::cast(s->double_factor);
      },
      py::arg("op"), "PREMUL_SUM's factor (a float or a 1-element tensor), else None.");
  py::class_<Backend, c10d::Backend, c10::intrusive_ptr<Backend>>(m, "FabricollBackend")
      .def(py::init([](py::object full, uintptr_t comm, int rank, int size, double timeout_s) {
             TORCH_CHECK(!full.is_none(), "fabricoll._c10d.FabricollBackend: full is None");
             TORCH_CHECK(comm != 0, "fabricoll._c10d.FabricollBackend: comm is NULL");
             TORCH_CHECK(timeout_s > 0, "fabricoll._c10d.FabricollBackend: timeout_s is ",
                         timeout_s, ", not positive");
             auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
             return c10::make_intrusive<Backend>(std::move(full),
                                                 reinterpret_cast<fabricoll_comm*>(comm), rank,
                                                 size, timeout);
           }),
           py::arg("full"), py::arg("comm"), py::arg("rank"), py::arg("size"),
           py::arg("timeout_s"))
      .def("_detach", &Backend::detach, py::call_guard<py::gil_scoped_release>(),
           "Stop using the communicator and `full` (its owner is about to destroy the "
           "communicator).");
}
