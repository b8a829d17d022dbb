#include "coordinator/stream_gate.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ddp {

absl::StatusOr<StreamGate::StreamId> StreamGate::Open(std::weak_ptr<WorkerChannel> channel) {
  absl::MutexLock lock(&mu_);
  if (open_.size() >= options_.max_streams) {
    return absl::ResourceExhaustedError(
        absl::StrCat(open_.size(),
                     " Attach streams are open, the coordinator's limit "
                     "(--max_attach_streams ",
                     options_.max_streams, "); try again later"));
  }
  const StreamId id = next_id_++;
  open_.insert(id);
  unregistered_.emplace(id,
                        Pending{clock_->Now() + options_.register_deadline, std::move(channel)});
  return id;
}

void StreamGate::Registered(StreamId id) {
  absl::MutexLock lock(&mu_);
  unregistered_.erase(id);
}

void StreamGate::Closed(StreamId id) {
  absl::MutexLock lock(&mu_);
  open_.erase(id);
  unregistered_.erase(id);
}

void StreamGate::CloseUnregistered() {
  const absl::Time now = clock_->Now();
  std::vector<std::shared_ptr<WorkerChannel>> late;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = unregistered_.begin();
         it != unregistered_.end() && it->second.deadline <= now;) {
      if (auto channel = it->second.channel.lock()) late.push_back(std::move(channel));
      it = unregistered_.erase(it);
    }
  }
  const absl::Status why = absl::DeadlineExceededError(
      absl::StrCat("no RegisterRequest within ", absl::FormatDuration(options_.register_deadline),
                   " of opening the Attach stream (--register_deadline); the first message on "
                   "a stream must register the worker"));
  for (const auto& channel : late) channel->Close(why);
}

size_t StreamGate::open() const {
  absl::MutexLock lock(&mu_);
  return open_.size();
}

size_t StreamGate::unregistered() const {
  absl::MutexLock lock(&mu_);
  return unregistered_.size();
}

}  // namespace ddp
