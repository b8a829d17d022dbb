#include "coordinator/status_watchers.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace ddp {

// One WatchStatus stream. Freed in OnDone, after it left the set, so the
// set's pointers are always live while mu_ is held.
class StatusWatch final : public grpc::ServerWriteReactor<v1::JobStatus> {
 public:
  StatusWatch(StatusWatchers* owner, absl::Duration interval)
      : owner_(owner), interval_(interval) {}

  void Offer(const std::shared_ptr<const v1::JobStatus>& status, absl::Time now) {
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finishing_ || now - last_write_ < interval_) return;
      writing_ = true;
      last_write_ = now;
      current_ = status;  // keeps the snapshot alive during the write
    }
    StartWrite(current_.get());
  }

  // Ends the stream before it wrote anything.
  void Refuse(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      finishing_ = true;
    }
    Finish(status);
  }

  void End() {
    {
      absl::MutexLock lock(&mu_);
      if (finishing_) return;
      finishing_ = true;
      if (writing_) return;  // OnWriteDone finishes
    }
    Finish(grpc::Status::OK);
  }

  void OnWriteDone(bool ok) override {
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) finishing_ = true;
      finish = finishing_;
    }
    if (finish) Finish(grpc::Status::OK);
  }

  void OnCancel() override { End(); }

  void OnDone() override {
    owner_->Remove(this);
    delete this;
  }

 private:
  StatusWatchers* owner_;
  const absl::Duration interval_;
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_write_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::shared_ptr<const v1::JobStatus> current_;
};

grpc::ServerWriteReactor<v1::JobStatus>* StatusWatchers::Start(
    std::shared_ptr<const v1::JobStatus> first, absl::Duration interval, absl::Time now) {
  auto* watch = new StatusWatch(this, interval);
  size_t open = 0;
  {
    absl::MutexLock lock(&mu_);
    open = watches_.size();
    if (open < max_watches_) watches_.insert(watch);
  }
  if (open >= max_watches_) {
    // Never in the set: OnDone's Remove finds nothing, and frees it.
    watch->Refuse(
        grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                     absl::StrCat(open,
                                  " WatchStatus streams are open, the coordinator's limit "
                                  "(--max_watch_streams ",
                                  max_watches_, "); poll GetStatus, or try again later")));
    return watch;
  }
  watch->Offer(first, now);
  return watch;
}

void StatusWatchers::Broadcast(const std::shared_ptr<const v1::JobStatus>& status, absl::Time now) {
  absl::MutexLock lock(&mu_);
  for (StatusWatch* watch : watches_) watch->Offer(status, now);
}

void StatusWatchers::FinishAll() {
  absl::MutexLock lock(&mu_);
  for (StatusWatch* watch : watches_) watch->End();
}

void StatusWatchers::Remove(StatusWatch* watch) {
  absl::MutexLock lock(&mu_);
  watches_.erase(watch);
}

}  // namespace ddp
