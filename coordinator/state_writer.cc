#include "coordinator/state_writer.h"

#include "common/logging.h"

namespace ddp {

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

void StateWriter::Post(uint64_t sequence, v1::DurableState state) {
  absl::MutexLock lock(&mu_);
  if (queued_ && queued_->first > sequence) return;
  queued_.emplace(sequence, std::move(state));
  posted_ = std::max(posted_, sequence);
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
    if (absl::Status s = store_->Save(next.second, next.first); !s.ok()) {
      DDP_LOG(Error) << "can't save state: " << s.message();
    }
    absl::MutexLock lock(&mu_);
    written_ = std::max(written_, next.first);
  }
}

}  // namespace ddp
