#include "worker/link/outbox.h"

namespace ddp {

void Outbox::Push(v1::WorkerMessage message) {
  absl::MutexLock lock(&mu_);
  // Reports made before this message go before it: "done" must not overtake
  // the last steps' reports.
  if (!reports_.empty()) control_.push_back(TakeReportsLocked());
  control_.push_back(std::move(message));
}

v1::WorkerMessage Outbox::TakeReportsLocked() {
  v1::WorkerMessage batch;
  auto* reports = batch.mutable_reports();
  for (auto& r : reports_) *reports->add_reports() = std::move(r);
  reports->set_dropped(dropped_);
  reports_.clear();
  dropped_ = 0;
  return batch;
}

void Outbox::PushReport(v1::StepReport report) {
  absl::MutexLock lock(&mu_);
  if (reports_.empty()) oldest_report_ = clock_->Now();
  if (reports_.size() >= options_.max_reports) {
    reports_.pop_front();
    ++dropped_;
    ++dropped_total_;
  }
  reports_.push_back(std::move(report));
}

bool Outbox::ReadyLocked(absl::Time now) const {
  return interrupted_ || !control_.empty() ||
         (!reports_.empty() && now - oldest_report_ >= options_.batch_delay);
}

std::vector<v1::WorkerMessage> Outbox::Take(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  // Reports become due by the passage of time, so wake at the sooner of the
  // caller's deadline and the oldest report's batch deadline.
  while (!ReadyLocked(clock_->Now())) {
    absl::Time wake = deadline;
    if (!reports_.empty()) wake = std::min(wake, oldest_report_ + options_.batch_delay);
    if (clock_->Now() >= deadline) break;
    clock_->AwaitWithDeadline(mu_,
                              absl::Condition(
                                  +[](Outbox* o) ABSL_EXCLUSIVE_LOCKS_REQUIRED(o->mu_) {
                                    return o->interrupted_ || !o->control_.empty();
                                  },
                                  this),
                              wake);
  }
  interrupted_ = false;
  std::vector<v1::WorkerMessage> out(std::make_move_iterator(control_.begin()),
                                     std::make_move_iterator(control_.end()));
  control_.clear();
  if (!reports_.empty() && clock_->Now() - oldest_report_ >= options_.batch_delay) {
    out.push_back(TakeReportsLocked());
  }
  return out;
}

void Outbox::Requeue(std::vector<v1::WorkerMessage> messages) {
  absl::MutexLock lock(&mu_);
  control_.insert(control_.begin(), std::make_move_iterator(messages.begin()),
                  std::make_move_iterator(messages.end()));
}

void Outbox::Interrupt() {
  absl::MutexLock lock(&mu_);
  interrupted_ = true;
}

void Outbox::Clear() {
  absl::MutexLock lock(&mu_);
  control_.clear();
  reports_.clear();
  dropped_ = 0;
}

uint64_t Outbox::dropped_total() const {
  absl::MutexLock lock(&mu_);
  return dropped_total_;
}

size_t Outbox::queued_reports() const {
  absl::MutexLock lock(&mu_);
  return reports_.size();
}

}  // namespace ddp
