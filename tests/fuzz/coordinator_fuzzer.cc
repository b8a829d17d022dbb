// libFuzzer: the coordinator core driven by arbitrary requests, as any
// client on the network could send them: registrations, every worker
// message, store calls, job submissions and cancellations, lost streams and
// the passing of time, in any order. Nothing may crash, trip a sanitizer,
// or grow the status snapshot without bound.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/version.h"
#include "coordinator/coordinator.h"

namespace {

class NullChannel final : public ddp::WorkerChannel {
 public:
  void Send(const ddp::v1::CoordinatorMessage&) override {}
  void Close(const absl::Status&) override {}
};

template <typename Message>
Message Parse(FuzzedDataProvider& in) {
  Message m;
  m.ParseFromString(in.ConsumeRandomLengthString(4096));
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  ddp::FakeClock clock;
  ddp::Coordinator::Options options;
  options.snapshot_min_interval = absl::ZeroDuration();
  options.require_store_tokens = size % 2 == 0;
  ddp::Coordinator core(&clock, options);
  std::vector<ddp::Coordinator::Session> sessions;
  for (int op = 0; op < 64 && in.remaining_bytes() > 0; ++op) {
    switch (in.ConsumeIntegralInRange<int>(0, 10)) {
      case 0: {
        auto request = Parse<ddp::v1::RegisterRequest>(in);
        if (in.ConsumeBool()) request.set_version(ddp::kVersion);
        auto session = core.Attach(request, std::make_shared<NullChannel>());
        if (session.ok()) sessions.push_back(*session);
        break;
      }
      case 1:
        if (!sessions.empty()) {
          const auto& s = sessions[in.ConsumeIntegralInRange<size_t>(0, sessions.size() - 1)];
          core.OnMessage(s, Parse<ddp::v1::WorkerMessage>(in));
        }
        break;
      case 2: {
        auto request = Parse<ddp::v1::StoreSetRequest>(in);
        (void)core.StoreSet(request, in.ConsumeRandomLengthString(64));
        break;
      }
      case 3: {
        auto request = Parse<ddp::v1::StoreGetRequest>(in);
        core.StoreGet(
            request, [](absl::StatusOr<std::string>) {}, in.ConsumeRandomLengthString(64));
        break;
      }
      case 4: {
        auto request = Parse<ddp::v1::StoreAddRequest>(in);
        (void)core.StoreAdd(request, in.ConsumeRandomLengthString(64));
        break;
      }
      case 5:
        // No validate_job: the spec's own checks, then the core takes it.
        core.SubmitJob(Parse<ddp::v1::JobSpec>(in), [](absl::StatusOr<ddp::v1::JobSpec>) {});
        break;
      case 6: {
        const std::string job = in.ConsumeRandomLengthString(64);
        core.CancelJob(job, in.ConsumeRandomLengthString(64), [](absl::Status) {});
        break;
      }
      case 7:
        if (!sessions.empty()) {
          const size_t i = in.ConsumeIntegralInRange<size_t>(0, sessions.size() - 1);
          core.OnStreamClosed(sessions[i], "fuzz");
        }
        break;
      case 8:
        clock.Advance(absl::Milliseconds(in.ConsumeIntegralInRange<int>(0, 120000)));
        core.Tick();
        break;
      case 9:
        (void)core.GetJob(in.ConsumeRandomLengthString(64));
        break;
      case 10:
        (void)core.ListJobs(Parse<ddp::v1::ListJobsRequest>(in));
        break;
    }
  }
  core.Tick();
  // Whatever was sent, what operators read stays bounded.
  if (core.Snapshot()->ByteSizeLong() > (size_t{64} << 20)) __builtin_trap();
  return 0;
}
