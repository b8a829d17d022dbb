#include "coordinator/status_watchers.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace ddp {

// One WatchStatus stream. Each method decides under mu_ and calls gRPC
// (StartWrite, Finish) after releasing it, so no lock of ours is held
// while gRPC runs, and gRPC's own callbacks never wait on a lock gRPC may
// hold. Finish is called once, only after finishing_ was set, and no
// StartWrite follows it: after OnDone nothing calls into gRPC.
//
// Owned by a shared_ptr: `self_` (gRPC's reference, dropped in OnDone) and
// any copy a Broadcast or FinishAll took, so a watch that finishes while
// they offer to it outside the owner's lock is still memory, not freed.
class StatusWatch final : public grpc::ServerWriteReactor<v1::JobStatus> {
 public:
  StatusWatch(StatusWatchers* owner, absl::Duration interval, std::string job_id)
      : owner_(owner), interval_(interval), job_id_(std::move(job_id)) {}

  const std::string& job_id() const { return job_id_; }

  // Whether an Offer now would write.
  bool Due(absl::Time now) {
    absl::MutexLock lock(&mu_);
    return !writing_ && !finishing_ && now - last_write_ >= interval_;
  }

  void Offer(const std::shared_ptr<const v1::JobStatus>& status, absl::Time now) {
    const v1::JobStatus* write = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finishing_ || now - last_write_ < interval_) return;
      writing_ = true;
      last_write_ = now;
      current_ = status;  // keeps the snapshot alive during the write
      write = current_.get();
    }
    StartWrite(write);
  }

  // Ends the stream before it wrote anything.
  void Refuse(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      finishing_ = true;
    }
    Finish(status);
  }

  // Ends the stream with `status` (after a write in flight).
  void End(const grpc::Status& status = grpc::Status::OK) {
    {
      absl::MutexLock lock(&mu_);
      if (finishing_) return;
      finishing_ = true;
      end_status_ = status;
      if (writing_) return;  // OnWriteDone finishes
    }
    Finish(status);
  }

  void OnWriteDone(bool ok) override {
    bool finish = false;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) finishing_ = true;
      finish = finishing_;
      status = end_status_;
    }
    if (finish) Finish(status);
  }

  void OnCancel() override { End(); }

  void OnDone() override {
    owner_->Remove(this);
    // Frees this watch here unless a Broadcast still holds it; that one
    // sees finishing_ and calls nothing.
    std::shared_ptr<StatusWatch> last = std::move(self_);
  }

  std::shared_ptr<StatusWatch> self_;  // set once by Start, before gRPC sees it

 private:
  StatusWatchers* owner_;
  const absl::Duration interval_;
  const std::string job_id_;
  absl::Mutex mu_;
  grpc::Status end_status_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_write_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::shared_ptr<const v1::JobStatus> current_ ABSL_GUARDED_BY(mu_);
};

grpc::ServerWriteReactor<v1::JobStatus>* StatusWatchers::Start(
    std::shared_ptr<const v1::JobStatus> first, absl::Duration interval, absl::Time now,
    const std::string& job_id) {
  auto watch = std::make_shared<StatusWatch>(this, interval, job_id);
  watch->self_ = watch;
  size_t open = 0;
  {
    absl::MutexLock lock(&mu_);
    open = watches_.size();
    if (open < max_watches_) watches_.emplace(watch.get(), watch);
  }
  if (open >= max_watches_) {
    // Never in the set: OnDone's Remove finds nothing, and frees it.
    watch->Refuse(
        grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                     absl::StrCat(open,
                                  " WatchStatus streams are open, the coordinator's limit "
                                  "(--max_watch_streams ",
                                  max_watches_, "); poll GetStatus, or try again later")));
    return watch.get();
  }
  watch->Offer(first, now);
  return watch.get();
}

std::vector<std::shared_ptr<StatusWatch>> StatusWatchers::Open() {
  std::vector<std::shared_ptr<StatusWatch>> open;
  absl::MutexLock lock(&mu_);
  open.reserve(watches_.size());
  for (const auto& [raw, watch] : watches_) open.push_back(watch);
  return open;
}

void StatusWatchers::Broadcast(const ViewOf& view_of, absl::Time now) {
  // Each job's view is built once, and only when a watch of it is due.
  std::map<std::string, absl::StatusOr<std::shared_ptr<const v1::JobStatus>>> views;
  for (const std::shared_ptr<StatusWatch>& watch : Open()) {
    if (!watch->Due(now)) continue;
    auto view = views.find(watch->job_id());
    if (view == views.end()) view = views.emplace(watch->job_id(), view_of(watch->job_id())).first;
    if (view->second.ok()) {
      watch->Offer(*view->second, now);
    } else {
      watch->End(ToGrpcStatus(view->second.status()));
    }
  }
}

void StatusWatchers::FinishAll() {
  for (const std::shared_ptr<StatusWatch>& watch : Open()) watch->End();
}

size_t StatusWatchers::open_count() {
  absl::MutexLock lock(&mu_);
  return watches_.size();
}

void StatusWatchers::Remove(StatusWatch* watch) {
  absl::MutexLock lock(&mu_);
  watches_.erase(watch);
}

}  // namespace ddp
