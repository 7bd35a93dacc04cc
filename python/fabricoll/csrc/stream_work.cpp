// The Work of the operations on CUDA tensors (see stream_work.h).
#include "stream_work.h"

#include "convert.h"

#include <ATen/core/ivalue_inl.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <thread>

namespace fabricoll_ext {
namespace {

c10::Stream current_of(c10::Device device) {
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

}  // namespace

bool reserved(const c10::Stream& stream) {
  return reinterpret_cast<uintptr_t>(stream.native_handle()) <= 2;
}

Launch::Launch(c10::Device device, const std::function<c10::Stream()>& side)
    : guard_(device), current_(current_of(device)), run_(current_) {
  if (reserved(current_)) {
    run_ = side();
    c10::Event ready(device.type());
    ready.record(current_);
    ready.block(run_);
  }
}

void Launch::finish() {
  if (run_ != current_) {
    c10::Event done(run_.device_type());
    done.record(run_);
    done.block(current_);
  }
}

void record_on(const c10::Stream& stream, const std::vector<at::Tensor>& tensors) {
  c10::impl::VirtualGuardImpl impl(stream.device_type());
  for (const at::Tensor& t : tensors) {
    if (t.defined() && t.has_storage()) {
      impl.recordDataPtrOnStream(t.storage().data_ptr(), stream);
    }
  }
}

c10::Stream StreamOrder::side(c10::Device device) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const c10::Stream& s : sides_) {
    if (s.device() == device) return s;
  }
  c10::Stream s = c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device);
  TORCH_CHECK(!reserved(s), "fabricoll: torch's stream pool gave a default stream for ", device);
  sides_.push_back(s);
  return s;
}

void StreamOrder::add(std::shared_ptr<c10::Event> event) {
  std::lock_guard<std::mutex> lock(mu_);
  // Drop the finished ones at the front, so that the list stays as long as what is in flight.
  while (!pending_.empty() && pending_.front()->query()) {
    pending_.pop_front();
  }
  pending_.push_back(std::move(event));
}

void StreamOrder::drain(const char* op, std::chrono::milliseconds timeout) {
  std::deque<std::shared_ptr<c10::Event>> events;
  {
    std::lock_guard<std::mutex> lock(mu_);
    events.swap(pending_);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(20);
  while (!events.empty()) {
    if (events.front()->query()) {
      events.pop_front();
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      size_t left = events.size();
      {
        // Put back what is still running, ahead of anything added meanwhile.
        std::lock_guard<std::mutex> lock(mu_);
        for (auto it = events.rbegin(); it != events.rend(); ++it) pending_.push_front(*it);
      }
      C10_THROW_ERROR(DistBackendError,
                      std::string("fabricoll ") + op + ": " + std::to_string(left) +
                          " operation(s) on CUDA streams did not pass their stream within " +
                          std::to_string(timeout.count()) +
                          " ms (the group's timeout): their streams are held up");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

StreamWork::StreamWork(int rank, c10d::OpType type, std::string name, fabricoll_comm* comm,
                       const Launch& at, std::vector<at::Tensor> result)
    : c10d::Work(rank, type, nullptr, std::nullopt),
      name_(std::move(name)),
      comm_(comm),
      device_(at.device()),
      event_(std::make_shared<c10::Event>(at.device().type())),
      result_(std::move(result)) {
  event_->record(at.current());
  // Completed now, on the device: a consumer's stream waits for the events torch records
  // here on the current stream, which has the operation (Launch::finish).
  future_ = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()), std::vector<c10::Device>{device_});
  future_->markCompleted(c10::IValue(result_));
}

std::exception_ptr StreamWork::async_error() const {
  fabricoll_status status = FABRICOLL_SUCCESS;
  if (api().comm_get_async_error(comm_, &status) != FABRICOLL_SUCCESS) {
    return nullptr;  // the communicator is gone (shut down): nothing more to learn
  }
  if (status == FABRICOLL_SUCCESS) return nullptr;
  return backend_error(failure(name_.c_str(), "a stream-ordered call", status));
}

bool StreamWork::isCompleted() { return event_->query(); }

bool StreamWork::isSuccess() const { return async_error() == nullptr; }

std::exception_ptr StreamWork::exception() const { return async_error(); }

bool StreamWork::wait(std::chrono::milliseconds /*timeout: the host does not wait*/) {
  synchronize();
  if (std::exception_ptr e = async_error()) std::rethrow_exception(e);
  return true;
}

void StreamWork::synchronize() {
  c10::DeviceGuard guard(device_);
  event_->block(current_of(device_));
}

}  // namespace fabricoll_ext
