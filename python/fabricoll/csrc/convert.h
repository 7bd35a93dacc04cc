// Tensors, dtypes and reduction ops as the C API takes them, and its errors as torch's, shared
// by the compiled front's Works and its host (backend.cpp) and CUDA (backend_cuda.cpp) paths.
#pragma once

#include <torch/csrc/distributed/c10d/Types.hpp>

#include <exception>
#include <optional>
#include <string>

#include "api.h"

namespace fabricoll_ext {

// A tensor the engines can use as it is: dense, contiguous CPU memory without lazy
// conjugate or negative bits.
bool plain(const at::Tensor& t);

// The engine datatype a tensor dtype reduces in directly (fabricoll/_dtypes.py's DIRECT).
std::optional<int> engine_dtype(at::ScalarType t);

// Whether an engine datatype is a floating-point one.
bool floating(int dtype);

// The engine op for `op` on `dtype`, where it maps directly (bitwise ops on integers
// only; PREMUL_SUM and the rest go to the Python backend, which also words the errors).
std::optional<int> engine_op(const c10d::ReduceOp& op, int dtype);

// Throw torch's DistBackendError for a call `function` of `op` that failed to start.
[[noreturn]] void fail(const char* op, const char* function, int status);

size_t bytes(const at::Tensor& t);

// torch's DistBackendError (torch.distributed.DistBackendError in Python) carrying `msg`.
std::exception_ptr backend_error(const std::string& msg);

}  // namespace fabricoll_ext
