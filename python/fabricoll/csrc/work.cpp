// The compiled backend's Work (see work.h).
#include "work.h"

#include "convert.h"

#include <c10/util/Exception.h>

namespace fabricoll_ext {
namespace {

using State = Op::State;

// fabricoll_callback: `user_data` is a heap std::shared_ptr<Op>, one per handed-over
// request. Runs in the progress thread (or in the notifying thread when the request had
// already completed). Nothing may unwind into the library.
void on_complete(void* user_data, int status) {
  auto* holder = static_cast<std::shared_ptr<Op>*>(user_data);
  std::shared_ptr<Op> op = std::move(*holder);
  delete holder;
  std::string message;
  if (status != 0) {
    try {
      const char* last = api().last_error();
      message = std::string("fabricoll ") + op->name + ": the operation failed: " +
                api().status_string(status) + " (" + std::to_string(status) +
                "): " + (last != nullptr ? last : "");
    } catch (...) {
      message.clear();  // out of memory: the status alone is reported
    }
  }
  try {
    op->one_done(status, message);
  } catch (...) {
    // Only allocation can throw here; there is no caller to report it to.
  }
}

}  // namespace

void Op::hand_over() {
  for (fabricoll_request* req : requests) {
    auto* holder = new std::shared_ptr<Op>(shared_from_this());
    int rc = api().request_notify(req, &on_complete, holder);
    if (rc != 0) {
      // Not taken (a bad argument): finish it in this thread instead.
      delete holder;
      std::string msg = failure(name.c_str(), "fabricoll_request_notify", rc);
      api().wait(req);
      one_done(rc, msg);
    }
  }
}

void Op::drive() {
  std::exception_ptr err;
  for (fabricoll_request* req : requests) {
    int rc = api().wait(req);
    if (rc != 0 && !err) {
      err = backend_error(failure(name.c_str(), "fabricoll_wait", rc));
    }
  }
  complete(err);
}

void Op::one_done(int status, const std::string& message) {
  bool last = false;
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (status != 0 && !error) {
      error = backend_error(message);
    }
    last = --remaining == 0;
    err = error;
  }
  if (last) {
    complete(err);
  }
}

void Op::complete(std::exception_ptr err) {
  if (!err && finish) {
    try {
      finish();
    } catch (...) {
      err = std::current_exception();
    }
  }
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  std::vector<at::Tensor> drop;
  {
    std::lock_guard<std::mutex> lock(mu);
    error = err;
    state = State::Done;
    drop.swap(keep);
    finish = nullptr;
    fut = future;
  }
  cv.notify_all();
  if (fut) {
    settle(fut);
  }
}

void Op::settle(const c10::intrusive_ptr<c10::ivalue::Future>& fut) {
  if (error) {
    fut->setError(error);
  } else {
    fut->markCompleted(c10::IValue(result));
  }
}

Work::Work(int rank, c10d::OpType type, std::string name,
           std::vector<fabricoll_request*> requests, std::vector<at::Tensor> result,
           std::vector<at::Tensor> keep, std::function<void()> finish)
    : c10d::Work(rank, type), op_(std::make_shared<Op>()) {
  op_->name = std::move(name);
  op_->requests = std::move(requests);
  op_->result = std::move(result);
  op_->keep = std::move(keep);
  op_->finish = std::move(finish);
  op_->remaining = op_->requests.size();
  if (op_->requests.empty()) {
    op_->complete(nullptr);
  }
}

c10::intrusive_ptr<Work> Work::done(int rank, c10d::OpType type, std::string name,
                                    std::vector<at::Tensor> result) {
  return c10::make_intrusive<Work>(rank, type, std::move(name),
                                   std::vector<fabricoll_request*>{}, std::move(result),
                                   std::vector<at::Tensor>{});
}

Work::~Work() {
  // Dropped before anyone asked: let the library finish the requests, so that they still
  // complete and free their buffers (the Op keeps those alive until then).
  bool hand = false;
  {
    std::lock_guard<std::mutex> lock(op_->mu);
    if (op_->state == State::Pending) {
      op_->state = State::Notified;
      hand = true;
    }
  }
  if (hand) {
    op_->hand_over();
  }
}

bool Work::isCompleted() {
  std::lock_guard<std::mutex> lock(op_->mu);
  return op_->state == State::Done;
}

bool Work::isSuccess() const {
  std::lock_guard<std::mutex> lock(op_->mu);
  return op_->state == State::Done && !op_->error;
}

std::exception_ptr Work::exception() const {
  std::lock_guard<std::mutex> lock(op_->mu);
  return op_->error;
}

std::vector<at::Tensor> Work::result() {
  wait(std::chrono::milliseconds(0));
  return op_->result;
}

bool Work::wait(std::chrono::milliseconds timeout) {
  Op& op = *op_;
  State was;
  bool hand = false;
  {
    std::lock_guard<std::mutex> lock(op.mu);
    was = op.state;
    if (was == State::Pending) {
      if (timeout.count() <= 0) {
        op.state = State::Waiting;
      } else {
        op.state = State::Notified;
        hand = true;
      }
    }
  }
  if (was == State::Pending && !hand) {
    op.drive();
  } else if (was != State::Done) {
    if (hand) {
      op.hand_over();
    }
    std::unique_lock<std::mutex> lock(op.mu);
    auto done = [&] { return op.state == State::Done; };
    if (timeout.count() <= 0) {
      op.cv.wait(lock, done);
    } else if (!op.cv.wait_for(lock, timeout, done)) {
      C10_THROW_ERROR(DistBackendError,
                      "fabricoll " + op.name + ": not complete after " +
                          std::to_string(timeout.count()) +
                          " ms (the operation is still in flight)");
    }
  }
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lock(op.mu);
    err = op.error;
  }
  if (err) {
    std::rethrow_exception(err);
  }
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> Work::getFuture() {
  Op& op = *op_;
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  State was;
  {
    std::lock_guard<std::mutex> lock(op.mu);
    if (op.future) {
      return op.future;
    }
    fut = op.future = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()));
    was = op.state;
    if (was == State::Pending) {
      op.state = State::Notified;
    }
  }
  if (was == State::Pending) {
    op.hand_over();
  } else if (was == State::Done) {
    op.settle(fut);
  }
  return fut;
}

}  // namespace fabricoll_ext
