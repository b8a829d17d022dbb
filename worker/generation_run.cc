#include "worker/generation_run.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/store_client.h"
#include "worker/gloo_communicator.h"
#include "worker/gloo_store.h"
#include "worker/shm_communicator.h"
#include "worker/trainer.h"
#ifdef DDP_HAVE_NCCL
#include "worker/nccl_communicator.h"
#endif

namespace ddp {
namespace {

// Forwards the trainer's news to the outbox, the heartbeat board and the
// metrics file.
class OutboxObserver final : public TrainingObserver {
 public:
  OutboxObserver(Outbox* outbox, ProgressBoard* board, const std::string& metrics_file,
                 uint32_t rank, bool send_reports)
      : outbox_(outbox), board_(board), rank_(rank), send_reports_(send_reports) {
    if (!metrics_file.empty()) metrics_.open(metrics_file, std::ios::app);
  }
  void OnPhase(v1::StepPhase phase, uint64_t step) override {
    board_->phase = phase;
    board_->step = step;
  }
  void OnStep(const v1::StepReport& report) override {
    board_->step = report.step();
    if (send_reports_) outbox_->PushReport(report);
    if (metrics_.is_open()) {
      // Buffered; flushed when the run ends.
      metrics_ << absl::StrFormat(
          "{\"generation\": %d, \"rank\": %d, \"epoch\": %d, \"step\": %d, \"loss\": %.9g, "
          "\"samples\": %d, \"step_seconds\": %.6f, \"allreduce_ms\": %.4f, \"wait_ms\": %.4f, "
          "\"buckets\": %d, \"unused\": %d, \"digest\": \"%s\", \"data_ms\": %.4f, "
          "\"forward_ms\": %.4f, \"backward_ms\": %.4f, \"optimizer_ms\": %.4f, "
          "\"time\": %.6f}\n",
          report.generation(), rank_, report.epoch(), report.step(), report.loss(),
          report.samples(), report.step_seconds(), report.reduction().allreduce_ms(),
          report.reduction().wait_ms(), report.reduction().buckets_total(),
          report.reduction().unused_parameters(), report.parameter_digest(),
          report.timings().data_ms(), report.timings().forward_ms(), report.timings().backward_ms(),
          report.timings().optimizer_ms(), absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
    }
  }
  void OnEpoch(const v1::EpochResult& result) override {
    v1::WorkerMessage message;
    *message.mutable_epoch_result() = result;
    outbox_->Push(std::move(message));
  }

 private:
  Outbox* outbox_;
  ProgressBoard* board_;
  const uint32_t rank_;
  const bool send_reports_;
  std::ofstream metrics_;
};

}  // namespace

GenerationRun::GenerationRun(v1::Assignment assignment, Environment env, Outbox* outbox,
                             ProgressBoard* board)
    : assignment_(std::move(assignment)), env_(std::move(env)), outbox_(outbox), board_(board) {
  thread_ = std::thread([this] { Run(); });
}

GenerationRun::~GenerationRun() {
  Abort("the worker is leaving the generation");
  thread_.join();
}

void GenerationRun::Abort(const std::string& reason) {
  std::shared_ptr<Communicator> comm;
  {
    absl::MutexLock lock(&mu_);
    if (abort_.exchange(true)) return;
    abort_reason_ = reason;
    comm = comm_;
  }
  if (comm) comm->Abort();
}

void GenerationRun::PushState(uint64_t generation, v1::WorkerState state, const std::string& detail,
                              const v1::ProbeResult* probe) {
  v1::WorkerMessage message;
  v1::StateChange* change = message.mutable_state();
  change->set_generation(generation);
  change->set_state(state);
  change->set_detail(detail);
  if (probe) *change->mutable_probe() = *probe;
  outbox_->Push(std::move(message));
}

namespace {

// The backend a job's "auto" means for this generation.
std::string ChooseBackend(const v1::Assignment& a, const Device& device) {
  const std::string& wanted = a.spec().backend();
  if (wanted != "auto") return wanted;
  if (device.is_cuda()) return "nccl";
  return a.single_machine() && a.world_size() <= ShmCommunicator::kMaxRanks ? "shm" : "gloo";
}

}  // namespace

absl::StatusOr<std::shared_ptr<Communicator>> GenerationRun::Connect(StoreClient* store) {
  const v1::Assignment& a = assignment_;
  const absl::Duration timeout = absl::Seconds(a.spec().collective_timeout_seconds());
  const std::string backend = ChooseBackend(a, env_.device);
  CoordinatorGlooStore gloo_store(store, timeout);
  if (backend == "shm") {
    ShmCommunicator::Options options;
    options.rank = static_cast<int>(a.rank());
    options.world_size = static_cast<int>(a.world_size());
    options.timeout = timeout;
    auto created = ShmCommunicator::Create(gloo_store, options);
    if (created.ok()) return std::shared_ptr<Communicator>(std::move(*created));
    // Every rank learns the same outcome, so "auto" falls back together.
    if (a.spec().backend() == "shm" || !absl::IsFailedPrecondition(created.status())) {
      return created.status();
    }
    DDP_LOG(Warning) << "shared memory is not usable (" << created.status().message()
                     << "); using gloo over TCP";
  }
  if (backend == "nccl") {
#ifdef DDP_HAVE_NCCL
    NcclCommunicator::Options options;
    options.rank = static_cast<int>(a.rank());
    options.world_size = static_cast<int>(a.world_size());
    options.device = env_.device.index;
    options.timeout = timeout;
    auto created = NcclCommunicator::Create(store, options);
    if (!created.ok()) return created.status();
    return std::shared_ptr<Communicator>(std::move(*created));
#else
    return absl::FailedPreconditionError("this worker was built without NCCL");
#endif
  }
  GlooCommunicator::Options options;
  options.rank = static_cast<int>(a.rank());
  options.world_size = static_cast<int>(a.world_size());
  options.host = env_.host;
  options.timeout = timeout;
  auto created = GlooCommunicator::Create(gloo_store, options);
  if (!created.ok()) return created.status();
  return std::shared_ptr<Communicator>(std::move(*created));
}

absl::Status GenerationRun::RunSteps() {
  const v1::Assignment& a = assignment_;
  PushState(a.generation(), v1::WORKER_STATE_RENDEZVOUS,
            absl::StrCat("building the communicator with ", a.world_size() - 1, " peer(s)"));
  StoreClient store(env_.stub, a.job_id(), a.generation());
  absl::StatusOr<std::shared_ptr<Communicator>> connected = Connect(&store);
  if (!connected.ok()) return connected.status();
  std::shared_ptr<Communicator> comm = *connected;
  {
    absl::MutexLock lock(&mu_);
    comm_ = comm;
    if (abort_) comm->Abort();
  }

  // Prove the ring: every rank adds rank + 1.
  const absl::Time start = absl::Now();
  float value = static_cast<float>(a.rank() + 1);
  if (absl::Status s = comm->AllReduceSum(&value, 1); !s.ok()) return s;
  v1::ProbeResult probe;
  probe.set_expected(a.world_size() * (a.world_size() + 1) / 2.0);
  probe.set_observed(value);
  probe.set_latency_ms(absl::ToDoubleMilliseconds(absl::Now() - start));
  probe.set_backend(comm->backend());
  if (probe.observed() != probe.expected()) {
    return absl::DataLossError(
        absl::StrFormat("the probe all-reduce summed to %g instead of %g: the ring is broken",
                        probe.observed(), probe.expected()));
  }
  DDP_LOG(Info) << absl::StrFormat("%s ring of %d proven: probe all-reduce = %g in %.2f ms",
                                   comm->backend(), a.world_size(), probe.observed(),
                                   probe.latency_ms());
  PushState(a.generation(), v1::WORKER_STATE_TRAINING, "training", &probe);

  OutboxObserver observer(outbox_, board_, env_.metrics_file, a.rank(), env_.send_reports);
  return Train(a, comm.get(), &observer, abort_);
}

void GenerationRun::Run() {
  const v1::Assignment& a = assignment_;
  board_->generation = a.generation();
  board_->step = a.start_step();
  SetLogIdentity(absl::StrCat("worker ", a.worker_id(), " rank ", a.rank()));
  DDP_LOG(Info) << "joined generation " << a.generation() << " of job " << a.job_id() << " as rank "
                << a.rank() << " of " << a.world_size();
  const absl::Status status = RunSteps();
  std::string reason;
  {
    absl::MutexLock lock(&mu_);
    reason = abort_reason_;
  }
  if (status.ok()) {
    DDP_LOG(Info) << "finished generation " << a.generation();
    PushState(a.generation(), v1::WORKER_STATE_DONE,
              absl::StrCat("finished at step ", board_->step.load()));
  } else if (abort_) {
    DDP_LOG(Info) << "left generation " << a.generation() << ": " << reason;
    PushState(a.generation(), v1::WORKER_STATE_IDLE, absl::StrCat("left: ", reason));
  } else {
    DDP_LOG(Error) << "generation " << a.generation() << " failed: " << status.message();
    PushState(a.generation(), v1::WORKER_STATE_FAILED, std::string(status.message()));
    // Free again whatever the coordinator made of the failure.
    PushState(a.generation(), v1::WORKER_STATE_IDLE, "after a failure");
  }
  board_->generation = 0;
  board_->phase = v1::STEP_PHASE_UNSPECIFIED;
  finished_ = true;
}

}  // namespace ddp
