// The Python backend (fabricoll/_backend.py) as the compiled front reaches it: its methods
// called by their Python names under the GIL, the Works they return wrapped for torch.
//
// The front holds the Python object itself, not a c10d::Backend, so this works whether or
// not the torch in use lets Python subclass its c10d Backend (2.15 does, 2.11 does not):
// on such a torch the Python backend is a plain object that only the front calls.
//
// Every touch of a Python object takes the GIL. After the interpreter has finalized (a
// process group torch frees at exit) the references are leaked instead of dropped.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include <utility>

namespace fabricoll_ext {

namespace py = pybind11;

// Whether Python objects may still be touched (the interpreter is up and not finalizing).
bool python_alive();

// A Work the Python backend returned (a subclass of torch's Work in Python), kept alive
// with its Python object so that its Python methods stay reachable; wait, getFuture and
// isCompleted reach them.
class PyWork : public c10d::Work {
 public:
  // `work`: the Python Work (the GIL is held).
  explicit PyWork(py::object work);
  ~PyWork() override;

  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  bool isCompleted() override;

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  py::object py_;
};

class PythonBackend {
 public:
  // `backend`: the Python backend (the GIL is held).
  explicit PythonBackend(py::object backend) : obj_(std::move(backend)) {}
  ~PythonBackend();
  PythonBackend(const PythonBackend&) = delete;
  PythonBackend& operator=(const PythonBackend&) = delete;

  // `method(args...)`: the Work it returns (null where it returns None).
  template <class... Args>
  c10::intrusive_ptr<c10d::Work> work(const char* method, Args&&... args) {
    py::gil_scoped_acquire gil;
    py::object result = target(method).attr(method)(std::forward<Args>(args)...);
    if (result.is_none()) return {};
    return c10::make_intrusive<PyWork>(std::move(result));
  }

  // `method(args...)`, its result dropped.
  template <class... Args>
  void call(const char* method, Args&&... args) {
    py::gil_scoped_acquire gil;
    target(method).attr(method)(std::forward<Args>(args)...);
  }

  // `method()` as an unsigned integer.
  uint64_t number(const char* method);

  // Call `method()` (shutdown or abort), then drop the reference, which breaks the cycle
  // through the Python backend's `_front`; later calls raise. Nothing when already dropped.
  void last_call(const char* method);
  // Drop the reference (the Python backend detaches the front before it destroys the
  // communicator).
  void release();

 private:
  // The Python object (a new reference; the GIL is held), or an error naming `method`
  // once released.
  py::object target(const char* method) const;

  py::object obj_;  // touched only under the GIL
};

}  // namespace fabricoll_ext
