#include "coordinator/state_writer.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace ddp {
namespace {

absl::Status NotSaved(const StateStore& store, const absl::Status& why) {
  return absl::UnavailableError(absl::StrCat("the coordinator could not save its state to ",
                                             store.Describe(), " (", why.message(),
                                             "), so nothing was changed; try again"));
}

}  // namespace

StateWriter::StateWriter(StateStore* store) : store_(store) {
  thread_ = std::thread([this] { Loop(); });
}

StateWriter::~StateWriter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void StateWriter::Post(uint64_t sequence, v1::DurableState state, std::vector<Durable> done) {
  std::vector<Durable> answer_now;
  absl::Status now_status;
  {
    absl::MutexLock lock(&mu_);
    if (sequence <= written_) {
      // A newer state was saved (or failed to be) already: it held this one.
      answer_now = std::move(done);
      now_status = sequence <= saved_ ? absl::OkStatus() : NotSaved(*store_, last_error_);
    } else {
      for (Durable& d : done) waiting_.emplace(sequence, std::move(d));
      if (!queued_ || queued_->first < sequence) queued_.emplace(sequence, std::move(state));
      posted_ = std::max(posted_, sequence);
    }
  }
  for (Durable& d : answer_now) d(now_status);
}

void StateWriter::Flush() {
  absl::MutexLock lock(&mu_);
  struct Target {
    StateWriter* writer;
    uint64_t sequence;
  } target{this, posted_};
  mu_.Await(absl::Condition(
      +[](Target* t) ABSL_NO_THREAD_SAFETY_ANALYSIS { return t->writer->written_ >= t->sequence; },
      &target));
}

void StateWriter::Loop() {
  while (true) {
    std::pair<uint64_t, v1::DurableState> next;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](StateWriter* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) {
            return w->stopping_ || w->queued_.has_value();
          },
          this));
      if (!queued_) return;  // stopping, nothing left
      next = std::move(*queued_);
      queued_.reset();
    }
    absl::Status s = store_->Save(next.second, next.first);
    if (!s.ok()) DDP_LOG(Error) << "can't save state: " << s.message();
    std::vector<Durable> answered;
    {
      absl::MutexLock lock(&mu_);
      written_ = std::max(written_, next.first);
      if (s.ok()) {
        saved_ = std::max(saved_, next.first);
      } else {
        last_error_ = s;
      }
      auto end = waiting_.upper_bound(next.first);
      for (auto it = waiting_.begin(); it != end; ++it) answered.push_back(std::move(it->second));
      waiting_.erase(waiting_.begin(), end);
    }
    const absl::Status answer = s.ok() ? s : NotSaved(*store_, s);
    for (Durable& d : answered) d(answer);
  }
}

}  // namespace ddp
