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
  py::class_<Backend, c10d::Backend, c10::intrusive_ptr<Backend>>(m, "FabricollBackend")
      .def(py::init([](const c10::intrusive_ptr<c10d::Backend>& full, uintptr_t comm, int rank,
                       int size) {
             TORCH_CHECK(full, "fabricoll._c10d.FabricollBackend: full backend is None");
             TORCH_CHECK(comm != 0, "fabricoll._c10d.FabricollBackend: comm is NULL");
             return c10::make_intrusive<Backend>(full, reinterpret_cast<fabricoll_comm*>(comm),
                                                 rank, size);
           }),
           py::arg("full"), py::arg("comm"), py::arg("rank"), py::arg("size"))
      .def("_detach", &Backend::detach, py::call_guard<py::gil_scoped_release>(),
           "Stop using the communicator (its owner is about to destroy it).");
}
