// The reducer's stream ordering and host staging (device_sync.h), without a
// GPU: CPU tensors whose work is ordered on fake CUDA streams. The fake
// guard, registered for CUDA in this binary only, logs every event record,
// block and stream synchronize; a wrapping communicator logs each
// collective into the same log, so the tests read one total order.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tests/torch/ranks.h"
#include "worker/collective/reducer.h"

namespace ddp {
namespace {

struct Entry {
  std::string what;  // record, block, sync, allreduce
  c10::StreamId stream = 0;
  int64_t event = 0;  // for record and block; the element count for allreduce
};

class Log {
 public:
  void Add(Entry e) {
    absl::MutexLock lock(&mu_);
    entries_.push_back(std::move(e));
  }
  std::vector<Entry> Take() {
    absl::MutexLock lock(&mu_);
    return std::move(entries_);
  }

 private:
  absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

Log& TheLog() {
  static Log* log = new Log;
  return *log;
}

// FakeGuardImpl's device and stream bookkeeping, with events that log.
struct RecordingGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType static_type = c10::DeviceType::CUDA;
  RecordingGuardImpl() = default;
  explicit RecordingGuardImpl(c10::DeviceType) {}

  c10::DeviceType type() const override { return static_type; }
  c10::Device exchangeDevice(c10::Device d) const override { return fake_.exchangeDevice(d); }
  c10::Device getDevice() const override { return fake_.getDevice(); }
  void setDevice(c10::Device d) const override { fake_.setDevice(d); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { fake_.uncheckedSetDevice(d); }
  c10::Stream getStream(c10::Device d) const noexcept override { return fake_.getStream(d); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    return fake_.exchangeStream(s);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return c10::Stream(c10::Stream::UNSAFE, d, next_stream_++);
  }
  c10::DeviceIndex deviceCount() const noexcept override { return fake_.deviceCount(); }

  // An event is its number, kept in the pointer.
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    if (*event == nullptr) *event = reinterpret_cast<void*>(next_event_++);
    TheLog().Add({"record", stream.id(), reinterpret_cast<int64_t>(*event)});
  }
  void block(void* event, const c10::Stream& stream) const override {
    TheLog().Add({"block", stream.id(), reinterpret_cast<int64_t>(event)});
  }
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream& stream) const override {
    TheLog().Add({"sync", stream.id(), 0});
  }

 private:
  c10::impl::FakeGuardImpl<c10::DeviceType::CUDA> fake_;
  static inline std::atomic<c10::StreamId> next_stream_{1};
  static inline std::atomic<int64_t> next_event_{1};
};

C10_REGISTER_GUARD_IMPL(CUDA, RecordingGuardImpl);

// A world of two identical ranks in one thread: a sum is twice this rank's
// values, so the reducer's average is exact and its gradients its own.
class LoopbackCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  std::string backend() const override { return "loopback"; }
  absl::Status AllReduceSum(float* data, size_t count) override {
    TheLog().Add({"allreduce", 0, static_cast<int64_t>(count)});
    for (size_t i = 0; i < count; ++i) data[i] *= 2;
    return absl::OkStatus();
  }
  absl::Status AllReduceSumHalf(uint16_t*, size_t, HalfType) override {
    return absl::UnimplementedError("loopback sums float32 only");
  }
  absl::Status Broadcast(void*, size_t, int) override { return absl::OkStatus(); }
  void Abort() override {}
};

struct Net {
  std::vector<NamedTensor> params;

  static Net Make(uint64_t seed) {
    auto gen = at::detail::createCPUGenerator(seed);
    Net n;
    for (auto [name, shape] :
         std::vector<std::pair<std::string, std::vector<int64_t>>>{{"fc1.weight", {8, 3}},
                                                                   {"fc1.bias", {8}},
                                                                   {"fc2.weight", {2, 8}},
                                                                   {"fc2.bias", {2}}}) {
      n.params.emplace_back(name, at::randn(shape, gen).requires_grad_(true));
    }
    return n;
  }
  Net Clone() const {
    Net n;
    for (const auto& [name, t] : params) {
      n.params.emplace_back(name, t.detach().clone().requires_grad_(true));
    }
    return n;
  }
  at::Tensor& p(size_t i) { return params[i].second; }
  at::Tensor Loss(const at::Tensor& x) {
    at::Tensor h = at::relu(at::linear(x, p(0), p(1)));
    return at::linear(h, p(2), p(3)).pow(2).mean();
  }
};

at::Tensor Batch(int rank, int step) {
  auto gen = at::detail::createCPUGenerator(1000 + 100 * rank + step);
  return at::randn({4, 3}, gen);
}

// fc2 (weight and bias: 18 floats) in one bucket, fc1 (32) in another.
Reducer::Options TwoBuckets() {
  Reducer::Options o;
  o.first_bucket_cap_bytes = 18 * sizeof(float);
  o.bucket_cap_bytes = 1 << 20;
  o.split_tail = false;
  o.rebuild_after_first_step = false;
  return o;
}

size_t Find(const std::vector<Entry>& log, size_t from, size_t to,
            const std::function<bool(const Entry&)>& match) {
  for (size_t i = from; i < to && i < log.size(); ++i) {
    if (match(log[i])) return i;
  }
  return std::string::npos;
}

std::string Dump(const std::vector<Entry>& log) {
  std::string s;
  for (const Entry& e : log) {
    s += e.what + " stream " + std::to_string(e.stream) + " " + std::to_string(e.event) + "\n";
  }
  return s;
}

class ReducerStreamsTest : public testing::TestWithParam<HostStaging> {};

TEST_P(ReducerStreamsTest, Step_ReadyRecordThenCommBlockThenCollective_StepEndWaitsOnComm) {
  const bool staged = GetParam() == HostStaging::kAlways;
  LoopbackCommunicator comm;
  Net net = Net::Make(5);
  Reducer::Options options = TwoBuckets();
  options.stream_device = c10::Device(c10::DeviceType::CUDA, 0);
  options.staging = GetParam();
  TheLog().Take();
  auto reducer = Reducer::Create(net.params, &comm, options);
  ASSERT_THAT(reducer, IsOk());
  const auto plan = (*reducer)->plan();
  ASSERT_EQ(plan.size(), 2u);
  // Each bucket's collective, by its size: gradients, a flag per parameter,
  // and the two control words in the last.
  std::vector<int64_t> sizes;
  for (size_t b = 0; b < plan.size(); ++b) {
    int64_t n = static_cast<int64_t>(plan[b].size()) + (b + 1 == plan.size() ? 2 : 0);
    for (size_t p : plan[b]) n += net.p(p).numel();
    sizes.push_back(n);
  }
  ASSERT_NE(sizes[0], sizes[1]);
  // Backward's work goes on a stream of its own, not the default one: the
  // reducer must use the current stream.
  c10::impl::VirtualGuardImpl cuda(c10::DeviceType::CUDA);
  const c10::Stream compute = cuda.getStreamFromGlobalPool(c10::Device(c10::DeviceType::CUDA, 0));
  c10::StreamGuard on_compute(compute);

  for (int step = 0; step < 2; ++step) {
    TheLog().Take();
    ASSERT_THAT((*reducer)->StartGroup(), IsOk());
    (*reducer)->PrepareBackward(/*sync=*/true);
    net.Loss(Batch(0, step)).backward();
    ASSERT_THAT((*reducer)->FinishBackward(), IsOk());
    TheLog().Add({"finished", 0, 0});
    const std::vector<Entry> log = TheLog().Take();
    const std::string dump = Dump(log);
    const size_t finished = log.size() - 1;

    c10::StreamId comm_stream = -1;
    size_t last_collective = 0;
    std::vector<int64_t> ready_events;
    for (size_t b = 0; b < plan.size(); ++b) {
      SCOPED_TRACE("step " + std::to_string(step) + ", bucket " + std::to_string(b) + "\n" + dump);
      const size_t collective = Find(log, 0, log.size(), [&](const Entry& e) {
        return e.what == "allreduce" && e.event == sizes[b];
      });
      ASSERT_NE(collective, std::string::npos);
      last_collective = std::max(last_collective, collective);
      // The last wait of another stream before it: the communication
      // stream's, on the bucket's ready event.
      size_t block = std::string::npos;
      for (size_t i = 0; i < collective; ++i) {
        if (log[i].what == "block" && log[i].stream != compute.id()) block = i;
      }
      ASSERT_NE(block, std::string::npos);
      if (comm_stream == -1) comm_stream = log[block].stream;
      EXPECT_EQ(log[block].stream, comm_stream);
      const int64_t event = log[block].event;
      ready_events.push_back(event);
      const size_t record = Find(
          log, 0, block, [&](const Entry& e) { return e.what == "record" && e.event == event; });
      ASSERT_NE(record, std::string::npos) << "the block's event was never recorded before it";
      EXPECT_EQ(log[record].stream, compute.id()) << "the ready event is the compute stream's";
      if (staged) {
        // The copy to the host buffer lands before the host collective.
        EXPECT_NE(Find(log, block, collective,
                       [&](const Entry& e) { return e.what == "sync" && e.stream == comm_stream; }),
                  std::string::npos);
      }
    }
    EXPECT_NE(ready_events[0], ready_events[1]) << "one event per bucket";

    SCOPED_TRACE("step " + std::to_string(step) + ", step end\n" + dump);
    const size_t done = Find(log, last_collective, log.size(), [&](const Entry& e) {
      return e.what == "record" && e.stream == comm_stream;
    });
    ASSERT_NE(done, std::string::npos) << "no event after the last collective";
    const size_t wait = Find(log, done, log.size(), [&](const Entry& e) {
      return e.what == "block" && e.event == log[done].event;
    });
    ASSERT_NE(wait, std::string::npos) << "the compute stream never waits for the collectives";
    EXPECT_EQ(log[wait].stream, compute.id());
    EXPECT_LT(wait, finished) << "FinishBackward returned before the wait";
    // Averaged over two identical ranks: the local gradient, exactly.
    Net local = Net::Make(5);
    local.Loss(Batch(0, step)).backward();
    for (size_t i = 0; i < net.params.size(); ++i) {
      EXPECT_TRUE(at::equal(net.p(i).grad(), local.p(i).grad())) << net.params[i].first;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Staging, ReducerStreamsTest,
                         testing::Values(HostStaging::kWhenNeeded, HostStaging::kAlways),
                         [](const testing::TestParamInfo<HostStaging>& info) {
                           return std::string(info.param == HostStaging::kAlways ? "Staged"
                                                                                 : "Direct");
                         });

// The implicit protocol ends the step in the autograd engine's callback:
// the compute stream waits there, before the program's optimizer can run.
TEST(ReducerStreams, ImplicitProtocol_StepEndWaitsBeforeTheFinishedCallback) {
  LoopbackCommunicator comm;
  Net net = Net::Make(7);
  Reducer::Options options = TwoBuckets();
  options.stream_device = c10::Device(c10::DeviceType::CUDA, 0);
  auto reducer = Reducer::Create(net.params, &comm, options);
  ASSERT_THAT(reducer, IsOk());
  int finished = 0;
  Reducer::ImplicitHooks hooks;
  hooks.sync = [] { return std::optional<ControlWords>(ControlWords{}); };
  hooks.finished = [&](bool sync, absl::StatusOr<ReductionStats> stats) {
    EXPECT_TRUE(sync);
    EXPECT_THAT(stats, IsOk());
    ++finished;
    TheLog().Add({"finished", 0, 0});
  };
  (*reducer)->EnableImplicit(std::move(hooks));
  TheLog().Take();
  net.Loss(Batch(0, 0)).backward();
  ASSERT_EQ(finished, 1);
  const std::vector<Entry> log = TheLog().Take();
  SCOPED_TRACE(Dump(log));
  ASSERT_FALSE(log.empty());
  ASSERT_EQ(log.back().what, "finished");
  size_t last_collective = 0;
  for (size_t i = 0; i < log.size(); ++i) {
    if (log[i].what == "allreduce") last_collective = i;
  }
  ASSERT_GT(last_collective, 0u);
  const size_t done =
      Find(log, last_collective, log.size(), [](const Entry& e) { return e.what == "record"; });
  ASSERT_NE(done, std::string::npos);
  const size_t wait = Find(log, done, log.size(), [&](const Entry& e) {
    return e.what == "block" && e.event == log[done].event;
  });
  ASSERT_NE(wait, std::string::npos) << "the compute stream never waits for the collectives";
  EXPECT_NE(log[wait].stream, log[done].stream);
  EXPECT_LT(wait, log.size() - 1);
}

TEST(ReducerStreams, CpuParametersWithoutStreamDevice_NothingRecordedOrAwaited) {
  for (HostStaging staging : {HostStaging::kWhenNeeded, HostStaging::kAlways}) {
    LoopbackCommunicator comm;
    Net net = Net::Make(6);
    Reducer::Options options = TwoBuckets();
    options.staging = staging;
    auto reducer = Reducer::Create(net.params, &comm, options);
    ASSERT_THAT(reducer, IsOk());
    TheLog().Take();
    for (int step = 0; step < 2; ++step) {
      ASSERT_THAT((*reducer)->StartGroup(), IsOk());
      (*reducer)->PrepareBackward(/*sync=*/true);
      net.Loss(Batch(0, step)).backward();
      ASSERT_THAT((*reducer)->FinishBackward(), IsOk());
    }
    // Only the collectives: no event, no wait, no synchronize.
    const std::vector<Entry> log = TheLog().Take();
    EXPECT_EQ(log.size(), 4u) << Dump(log);
    for (const Entry& e : log) EXPECT_EQ(e.what, "allreduce") << Dump(log);
  }
}

enum class Wire { kFloat32, kFloat16, kPowerSgd };

class ReducerStagingTest : public testing::TestWithParam<Wire> {};

// Each rank's gradients after each of three steps.
std::vector<std::vector<std::vector<at::Tensor>>> Train(Wire wire, HostStaging staging) {
  constexpr int kWorld = 2;
  constexpr int kSteps = 3;
  const Net init = Net::Make(9);
  std::vector<std::vector<std::vector<at::Tensor>>> grads(kWorld);
  RunRanks(kWorld, [&](int rank, Communicator* comm) {
    Net net = init.Clone();
    Reducer::Options options;
    options.first_bucket_cap_bytes = 16;
    options.bucket_cap_bytes = 64;
    options.staging = staging;
    if (wire == Wire::kFloat16) options.compression = HalfType::kFloat16;
    if (wire == Wire::kPowerSgd) options.powersgd = PowerSgdOptions{1, 2, 1.0, 3};
    auto reducer = Reducer::Create(net.params, comm, options);
    ASSERT_THAT(reducer, IsOk());
    for (int step = 0; step < kSteps; ++step) {
      ASSERT_THAT((*reducer)->StartGroup(), IsOk());
      (*reducer)->PrepareBackward(/*sync=*/true);
      net.Loss(Batch(rank, step)).backward();
      ASSERT_THAT((*reducer)->FinishBackward(), IsOk());
      std::vector<at::Tensor> step_grads;
      for (auto& [name, t] : net.params) step_grads.push_back(t.grad().clone());
      grads[rank].push_back(std::move(step_grads));
    }
  });
  return grads;
}

TEST_P(ReducerStagingTest, StagedOnCpu_GradientsBitIdenticalToUnstaged) {
  const auto direct = Train(GetParam(), HostStaging::kWhenNeeded);
  const auto staged = Train(GetParam(), HostStaging::kAlways);
  ASSERT_EQ(direct.size(), staged.size());
  for (size_t r = 0; r < direct.size(); ++r) {
    ASSERT_EQ(direct[r].size(), 3u);
    ASSERT_EQ(staged[r].size(), 3u);
    for (size_t s = 0; s < direct[r].size(); ++s) {
      for (size_t i = 0; i < direct[r][s].size(); ++i) {
        EXPECT_TRUE(at::equal(direct[r][s][i], staged[r][s][i]))
            << "rank " << r << " step " << s << " parameter " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Wires, ReducerStagingTest,
                         testing::Values(Wire::kFloat32, Wire::kFloat16, Wire::kPowerSgd),
                         [](const testing::TestParamInfo<Wire>& info) {
                           return std::string(info.param == Wire::kFloat32   ? "Float32"
                                              : info.param == Wire::kFloat16 ? "Float16"
                                                                             : "PowerSgd");
                         });

TEST(ReducerStreams, Create_ParametersOnTwoDevices_InvalidArgumentNamingBoth) {
  LoopbackCommunicator comm;
  std::vector<NamedTensor> params = {
      {"host.weight", at::zeros({2}).requires_grad_(true)},
      {"meta.weight", at::empty({2}, at::TensorOptions().device(at::kMeta)).requires_grad_(true)}};
  EXPECT_THAT(Reducer::Create(params, &comm, Reducer::Options()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       testing::AllOf(testing::HasSubstr("host.weight"),
                                      testing::HasSubstr("meta.weight"))));
}

TEST(ReducerStreams, Create_StreamDeviceWithoutStreams_InvalidArgument) {
  if (c10::impl::hasDeviceGuardImpl(c10::DeviceType::HIP)) GTEST_SKIP() << "HIP has streams";
  LoopbackCommunicator comm;
  Net net = Net::Make(1);
  Reducer::Options options;
  options.stream_device = c10::Device(c10::DeviceType::HIP, 0);
  EXPECT_THAT(Reducer::Create(net.params, &comm, options),
              StatusIs(absl::StatusCode::kInvalidArgument, testing::HasSubstr("hip")));
}

}  // namespace
}  // namespace ddp
