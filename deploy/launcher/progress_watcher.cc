#include "deploy/launcher/progress_watcher.h"

#include <iostream>

#include "absl/time/clock.h"

namespace ddp {

ProgressWatcher::ProgressWatcher(const std::string& target, const ClientSecurity& security)
    : stub_(v1::Coordinator::NewStub(MakeChannel(target, security, grpc::ChannelArguments()))) {
  thread_ = std::thread([this] { Loop(); });
}

void ProgressWatcher::Stop() {
  if (stop_.exchange(true)) return;
  {
    absl::MutexLock lock(&mu_);
    if (context_) context_->TryCancel();
  }
  thread_.join();
}

std::vector<std::string> ProgressWatcher::Drain(const v1::JobStatus& final_status) {
  Stop();
  return printer_.Update(final_status, absl::Now());
}

void ProgressWatcher::Loop() {
  while (!stop_) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      context_ = &context;
    }
    v1::WatchStatusRequest request;
    request.set_interval_seconds(0.25);
    auto reader = stub_->WatchStatus(&context, request);
    v1::JobStatus status;
    while (reader->Read(&status)) {
      for (const std::string& line : printer_.Update(status, absl::Now())) {
        std::cout << line << std::endl;
      }
    }
    reader->Finish();
    {
      absl::MutexLock lock(&mu_);
      context_ = nullptr;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

}  // namespace ddp
