#include "coordinator/job_validator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ddp {

JobValidator::JobValidator(Options options, Check check)
    : options_(options), check_(std::move(check)) {
  for (int i = 0; i < std::max(1, options_.concurrency); ++i) {
    threads_.emplace_back([this] { Loop(); });
  }
}

JobValidator::~JobValidator() { Shutdown(); }

void JobValidator::Validate(v1::JobSpec spec, Done done) {
  Validate(std::make_shared<v1::JobSpec>(std::move(spec)), std::move(done));
}

void JobValidator::Validate(std::shared_ptr<v1::JobSpec> spec, Done done) {
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) {
      refused = absl::UnavailableError("the coordinator is shutting down");
    } else if (waiting_.size() >= Capacity()) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat("too many job submissions being validated (", options_.concurrency,
                       " running, ", options_.max_waiting,
                       " waiting: --validate_concurrency, --validate_queue); try again "
                       "when they are done"));
    } else {
      waiting_.push_back({std::move(spec), std::move(done)});
      return;
    }
  }
  done(refused);
}

size_t JobValidator::Capacity() const {
  // A job queued for an idle thread that hasn't woken to take it yet is not
  // waiting behind the running ones: it counts against the idle threads.
  const int idle = std::max(1, options_.concurrency) - running_;
  return static_cast<size_t>(std::max(0, idle) + options_.max_waiting);
}

void JobValidator::Loop() {
  while (true) {
    Pending next;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](JobValidator* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->shut_down_ || !self->waiting_.empty();
          },
          this));
      if (shut_down_) return;
      next = std::move(waiting_.front());
      waiting_.pop_front();
      ++running_;
    }
    next.done(check_(*next.spec, stop_));
    absl::MutexLock lock(&mu_);
    --running_;
  }
}

void JobValidator::Shutdown() {
  std::deque<Pending> abandoned;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    abandoned.swap(waiting_);
  }
  stop_ = true;
  for (Pending& p : abandoned) p.done(absl::UnavailableError("the coordinator is shutting down"));
  for (std::thread& t : threads_) t.join();
}

}  // namespace ddp
