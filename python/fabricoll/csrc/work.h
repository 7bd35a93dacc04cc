// torch's Work for the compiled backend's operations: the completion of one or more
// non-blocking C requests, with the same ownership rules as fabricoll/_work.py.
//
// Each request has one owner at a time, switched under the operation's lock:
// - the Work, until someone asks for completion;
// - the thread in wait() without a timeout, which drives fabricoll_wait itself;
// - the library, once getFuture() (or wait with a timeout, or dropping the Work unwaited)
//   has handed the requests to fabricoll_request_notify: the communicator's progress thread
//   completes them and the callback completes the future. Nothing polls.
// Post-processing (copying results out of a staging buffer) runs once every request has
// succeeded, before the future completes or wait() returns.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "api.h"

namespace fabricoll_ext {

// What one operation's requests share with the library's callbacks (kept alive by each
// handed-over request as well as by the Work).
struct Op : std::enable_shared_from_this<Op> {
  enum class State { Pending, Waiting, Notified, Done };

  std::string name;                        // torch's name of the operation
  std::vector<fabricoll_request*> requests;
  std::vector<at::Tensor> result;          // what the future yields
  std::vector<at::Tensor> keep;            // buffers the requests read or write
  std::function<void()> finish;            // on success: copy results out

  std::mutex mu;
  std::condition_variable cv;
  State state = State::Pending;
  size_t remaining = 0;
  std::exception_ptr error;
  c10::intrusive_ptr<c10::ivalue::Future> future;

  // Hand every request to the library (the state is already Notified).
  void hand_over();
  // Wait for every request in this thread (the state is already Waiting).
  void drive();
  // One request finished with `status` (0: success); `message`: its error text.
  void one_done(int status, const std::string& message);
  // Every request finished: run finish, record the outcome, wake waiters, settle the future.
  void complete(std::exception_ptr err);
  // Complete `fut` with the result or the error.
  void settle(const c10::intrusive_ptr<c10::ivalue::Future>& fut);
};

class Work : public c10d::Work {
 public:
  // `requests` may be empty (nothing to move): the Work is then complete at once.
  Work(int rank, c10d::OpType type, std::string name, std::vector<fabricoll_request*> requests,
       std::vector<at::Tensor> result, std::vector<at::Tensor> keep,
       std::function<void()> finish = nullptr);
  // A Work whose operation already completed (a blocking call).
  static c10::intrusive_ptr<Work> done(int rank, c10d::OpType type, std::string name,
                                       std::vector<at::Tensor> result);
  ~Work() override;

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  // Block until done and raise its error. A positive timeout raises when it passes first
  // (the operation stays in flight); zero: the communicator's own deadline governs.
  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  void synchronize() override {}

 private:
  std::shared_ptr<Op> op_;
};

}  // namespace fabricoll_ext
