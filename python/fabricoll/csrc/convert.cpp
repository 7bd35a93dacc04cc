// Tensors, dtypes and reduction ops as the C API takes them (see convert.h).
#include "convert.h"

#include <c10/util/Exception.h>

namespace fabricoll_ext {

bool plain(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided && t.is_contiguous() &&
         !t.is_conj() && !t.is_neg();
}

std::optional<int> engine_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return FABRICOLL_FLOAT32;
    case at::kDouble: return FABRICOLL_FLOAT64;
    case at::kHalf: return FABRICOLL_FLOAT16;
    case at::kBFloat16: return FABRICOLL_BFLOAT16;
    case at::kChar: return FABRICOLL_INT8;
    case at::kByte: return FABRICOLL_UINT8;
    case at::kInt: return FABRICOLL_INT32;
    case at::kLong: return FABRICOLL_INT64;
    case at::kUInt32: return FABRICOLL_UINT32;
    case at::kUInt64: return FABRICOLL_UINT64;
    case at::kFloat8_e4m3fn: return FABRICOLL_FP8_E4M3;
    case at::kFloat8_e5m2: return FABRICOLL_FP8_E5M2;
    default: return std::nullopt;
  }
}

bool floating(int dtype) {
  switch (dtype) {
    case FABRICOLL_FLOAT32:
    case FABRICOLL_FLOAT64:
    case FABRICOLL_FLOAT16:
    case FABRICOLL_BFLOAT16:
    case FABRICOLL_FP8_E4M3:
    case FABRICOLL_FP8_E5M2: return true;
    default: return false;
  }
}

std::optional<int> engine_op(const c10d::ReduceOp& op, int dtype) {
  using R = c10d::ReduceOp::RedOpType;
  switch (op.op_) {
    case R::SUM: return FABRICOLL_SUM;
    case R::AVG: return FABRICOLL_AVG;
    case R::PRODUCT: return FABRICOLL_PROD;
    case R::MIN: return FABRICOLL_MIN;
    case R::MAX: return FABRICOLL_MAX;
    case R::BAND: return floating(dtype) ? std::nullopt : std::optional<int>(FABRICOLL_BAND);
    case R::BOR: return floating(dtype) ? std::nullopt : std::optional<int>(FABRICOLL_BOR);
    case R::BXOR: return floating(dtype) ? std::nullopt : std::optional<int>(FABRICOLL_BXOR);
    default: return std::nullopt;
  }
}

void fail(const char* op, const char* function, int status) {
  C10_THROW_ERROR(DistBackendError, failure(op, function, status));
}

size_t bytes(const at::Tensor& t) { return t.numel() * t.element_size(); }

std::exception_ptr backend_error(const std::string& msg) {
  try {
    C10_THROW_ERROR(DistBackendError, msg);
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace fabricoll_ext
