// torch's Work for the compiled backend's operations on CUDA tensors, which run through the
// C API's stream-ordered calls (fabricoll_<op>_stream) on torch's current stream.
//
// The call returns once the operation is enqueued: it runs after the work already on the
// stream, and later work on the stream waits for it, as NCCL's collectives do on theirs. So
// the Work is an event recorded on that stream right after the call:
// - wait() makes the caller's current stream wait for the event (the host does not block, as
//   with NCCL), then raises the communicator's asynchronous error if a stream-ordered call
//   failed after it returned;
// - isCompleted() asks the event;
// - getFuture() is a future completed at once, on the operation's device: torch's CUDA-aware
//   futures make whoever uses the value wait for the stream (no thread, no GIL involved).
//
// StreamOrder keeps the events of the operations that have not finished, so that a barrier
// can wait for them on the host, as NCCL's barrier does for its collectives.
#pragma once

#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "api.h"

namespace fabricoll_ext {

// Where one operation on CUDA tensors runs, with its device current for the calling thread
// (the C API's device calls use the thread's current context) until it goes out of scope.
// That is torch's current stream, unless it is the legacy default stream, which torch uses
// when nobody chose a stream and which the C API refuses (a wait on it would also hold back
// every blocking stream of the device): the operation then runs on a side stream of the
// device that first waits for the current stream, and the current stream waits for it once
// it is enqueued (finish()), so that the order on the current stream is the same.
class Launch {
 public:
  // `side` gives the device's side stream, asked for only where one is needed.
  Launch(c10::Device device, const std::function<c10::Stream()>& side);
  // The stream the operation runs on, and its CUstream.
  const c10::Stream& stream() const { return run_; }
  void* handle() const { return run_.native_handle(); }
  // The caller's current stream, which has the operation once finish() has run.
  const c10::Stream& current() const { return current_; }
  c10::Device device() const { return current_.device(); }
  // After the call was enqueued: the current stream waits for a side stream's work.
  void finish();

 private:
  c10::DeviceGuard guard_;
  c10::Stream current_;
  c10::Stream run_;
};

// Whether `stream`'s handle is one the C API refuses: the legacy default stream (0) or the
// reserved CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2).
bool reserved(const c10::Stream& stream);

// Make `tensors`' memory stay allocated until `stream` has passed the work enqueued so far
// (torch's caching allocator reuses a block freed meanwhile only once the streams that used
// it have passed that point).
void record_on(const c10::Stream& stream, const std::vector<at::Tensor>& tensors);

// A backend's side streams (one per device, from torch's pool) and the events of the
// operations on CUDA tensors not yet known complete, in issue order.
class StreamOrder {
 public:
  // The side stream of `device` (made on first use); see Launch.
  c10::Stream side(c10::Device device);
  void add(std::shared_ptr<c10::Event> event);
  // Wait on the host until every operation added so far has passed its stream. Raises
  // naming `op` when `timeout` passes first (a stream held up by the caller's own work).
  void drain(const char* op, std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::vector<c10::Stream> sides_;
  std::deque<std::shared_ptr<c10::Event>> pending_;
};

class StreamWork : public c10d::Work {
 public:
  // Called once `name`'s stream-ordered call was enqueued and `at` finished (with whatever
  // follows it on the current stream, such as a copy back): records the event on the
  // current stream and completes the future on the device.
  StreamWork(int rank, c10d::OpType type, std::string name, fabricoll_comm* comm,
             const Launch& at, std::vector<at::Tensor> result);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override { return result_; }
  // Make the current stream of the operation's device wait for it; raise the communicator's
  // asynchronous error, if any. Never blocks the host.
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  std::shared_ptr<c10::Event> event() const { return event_; }

 private:
  // The communicator's asynchronous error as an exception, or null.
  std::exception_ptr async_error() const;

  std::string name_;
  fabricoll_comm* comm_;
  c10::Device device_;
  std::shared_ptr<c10::Event> event_;
  std::vector<at::Tensor> result_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace fabricoll_ext
