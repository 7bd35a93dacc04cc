// The Python backend as the compiled front reaches it (see forward.h).
#include "forward.h"

#include <c10/util/Exception.h>

namespace fabricoll_ext {

bool python_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

namespace {

// Drop `obj` under the GIL, or leak it once Python is gone (taking the GIL then would
// crash or hang). Its owner is not in use by another thread.
void drop(py::object& obj) {
  if (!obj) return;
  if (!python_alive()) {
    obj.release();
    return;
  }
  py::gil_scoped_acquire gil;
  obj = py::object();
}

}  // namespace

PyWork::PyWork(py::object work)
    : work_(work.cast<c10::intrusive_ptr<c10d::Work>>()), py_(std::move(work)) {}

PyWork::~PyWork() {
  drop(py_);
  if (!python_alive()) {
    // The C++ half of a Python Work: freeing it without the interpreter is not safe either.
    (void)work_.release();
  }
}

bool PyWork::wait(std::chrono::milliseconds timeout) {
  // torch's trampoline for Python Works takes the GIL for the call itself.
  return work_->wait(timeout);
}

c10::intrusive_ptr<c10::ivalue::Future> PyWork::getFuture() { return work_->getFuture(); }

bool PyWork::isCompleted() {
  py::gil_scoped_acquire gil;
  return py_.attr("is_completed")().cast<bool>();
}

PythonBackend::~PythonBackend() { drop(obj_); }

py::object PythonBackend::target(const char* method) const {
  TORCH_CHECK(obj_ && !obj_.is_none(), "fabricoll ", method,
              ": the communicator is shut down (shutdown or abort)");
  return obj_;
}

uint64_t PythonBackend::number(const char* method) {
  py::gil_scoped_acquire gil;
  return target(method).attr(method)().cast<uint64_t>();
}

void PythonBackend::last_call(const char* method) {
  py::gil_scoped_acquire gil;
  if (!obj_) return;
  // The local reference keeps the object alive through the call, which may come back here
  // (release, from the Python backend's detaching the front).
  py::object obj = std::move(obj_);
  obj_ = py::object();
  obj.attr(method)();
}

void PythonBackend::release() { drop(obj_); }

}  // namespace fabricoll_ext
