// What a ddp::Session holds, shared with the rest of the library: the
// DistributedDataParallel hands it each step's reduction and outcome, the
// DistributedSampler asks it at each step boundary whether the job re-forms.
#ifndef DDP_WORKER_API_SESSION_IMPL_H_
#define DDP_WORKER_API_SESSION_IMPL_H_

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/line_file.h"
#include "ddp/session.h"
#include "ddp/v1/worker.pb.h"
#include "worker/api/coordinator_session.h"
#include "worker/api/store_server.h"
#include "worker/collective/collective_check.h"
#include "worker/collective/communicator.h"
#include "worker/collective/reducer.h"
#include "worker/elastic/state_codec.h"

namespace ddp {

// The sampler made last with a session, as the session sees it.
struct SamplerLink {
  // (epoch, cursor) once the batches handed out so far are trained.
  std::function<std::pair<uint64_t, uint64_t>()> position;
  // Go on from (epoch, cursor), split among `world` as `rank`; true when
  // that is past the pass the sampler is in, which it ends.
  std::function<bool(uint64_t epoch, uint64_t cursor, int rank, int world)> reposition;
};

// The DistributedDataParallel made last with a session.
struct DdpLink {
  // Before the communicator goes: drop the reducer over it.
  std::function<void()> release;
  // On a new communicator: what construction does (check the parameters,
  // copy them from the source rank) and a new reducer.
  std::function<void(int source)> rejoin;
  std::function<void()> zero_grads;
  // The fingerprint of its parameters (equal on every replica), then one
  // per parameter (at most kParameterDigests: runs of them past that), and
  // what each of those covers.
  std::function<std::string()> digest;
  std::function<std::vector<uint64_t>()> parameter_digests;
  std::function<std::vector<std::string>()> digest_names;
};

// Per-parameter digests a step report carries at most, and the bytes of
// each one's name: the coordinator's limits (coordinator/report_checks.h).
inline constexpr size_t kParameterDigests = 4096;
inline constexpr size_t kParameterDigestNameBytes = 256;

// A session over the worker daemon's communicator, whose trainer drives
// each synchronized backward itself (worker/trainer.cc): it puts its own
// control words in the step, and takes the reduction's outcome with its
// status code (the coordinator tells transient from fatal by it) instead of
// an exception out of backward.
struct StepDriver {
  std::function<ControlWords()> control;
  // Backward is done and waits for the buckets in flight.
  std::function<void()> waiting;
  // The synchronized backward's reduction, or why it failed; after it, the
  // buffers were copied from the broadcast rank (or that failed).
  std::function<void(absl::StatusOr<ReductionStats>)> reduced;
};

// What a sampler holds to reach its session; cleared when the session goes.
struct SessionGate {
  Session::Impl* impl = nullptr;
};

struct Session::Impl {
  Impl() : gate(std::make_shared<SessionGate>()) { gate->impl = this; }
  ~Impl() { gate->impl = nullptr; }

  // `what` failed with `status`: the message for ddp::Error, with the
  // coordinator's reason when it ended this rank's generation.
  std::string Explain(const absl::Status& status, const std::string& what) const;

  // Joined: this rank is done; waits (at most the timeout) for the job to
  // end. Once.
  void Finish();
  // A synchronized backward completed on every rank.
  void OnCommitted();
  // A synchronized backward failed with `failure`: true when the step is
  // dropped, to be undone at the next step boundary (elastic, and the
  // coordinator ended the generation); false when the error stands.
  bool VoidStep(const absl::Status& failure);
  // Re-forms now if the generation ended (where a step boundary is known).
  void AtStepBoundary();
  // The same at the sampler's step boundary (DistributedSampler::next).
  // When the state taken up ends the pass this rank's loop is in, its
  // source finished that pass's last step where this rank's backward failed
  // (a collective completed on some ranks only) and went on to the program's
  // end-of-epoch code, whose first collective the re-formation cut short:
  // this rank skips its own first one (SkipsCutShortCollective), so that
  // every rank's next collective is the same one.
  void AtSamplersStepBoundary();
  // A program collective (all_reduce_sum, broadcast, barrier) is to be
  // skipped, keeping this rank's values: the first one after
  // AtSamplersStepBoundary ended the pass; once, and not past the next
  // batch.
  bool SkipsCutShortCollective();
  // The sampler handed out a batch (after the index log's line).
  void OnBatch(const std::vector<size_t>& batch, uint64_t epoch);
  // Whether the sampler's next batch is a step boundary to re-form at: this
  // rank saw its generation end in a collective of its own (a dropped step,
  // or a leave vote after a finished one). Not merely the coordinator's
  // word, which reaches ranks at different points of the program: a rank
  // told between collectives goes on to its next one, which fails at once,
  // so that every rank re-forms after the same collective.
  bool SawEnd() const { return joined && elastic && saw_end; }
  // The generation ended with a step of `epoch` dropped: the sampler's pass
  // over that epoch is not over until the step is trained again.
  bool DroppedStepIn(uint64_t epoch) const;
  // A collective of the program's own failed: true when that was the
  // generation ending and the job re-formed (the values stay this rank's).
  bool ReformedAfter(const absl::Status& failure);
  // The sampler is past the pass of the last committed step (the program
  // left it with micro-batches of an open step, for its end-of-epoch code,
  // finish() or the next epoch): the job can only go on where the program's
  // loop is, at the start of the sampler's pass; the earlier pass's open
  // micro-batches are dropped with the step in flight. `at_pass_end`: also
  // when the sampler stands at the very end of the committed pass (not for
  // a dropped backward: that was the pass's own last step, which the
  // sampler trains again, DroppedStepIn).
  void GoOnAtLoopsPass(bool at_pass_end);
  // Started into a running job and not yet holding its state: the others
  // are past the program's start, so its own collectives are skipped.
  bool Joining() const;

  // The collectives go over `c` from now on, checked in order afresh.
  void UseCommunicator(Communicator* c) {
    comm = c;
    check = std::make_unique<CollectiveCheck>(c);
  }

  Options options;
  int rank = 0;
  int world_size = 1;
  std::unique_ptr<StoreServer> server;         // rank 0's, started torchrun's way
  std::unique_ptr<CoordinatorSession> joined;  // with a coordinator
  Communicator* comm = nullptr;                // the one above's, or `owned`
  std::shared_ptr<Communicator> owned;
  // Every collective of the session, its DistributedDataParallel and its
  // reducer is agreed on through this first (see collective_check.h).
  std::unique_ptr<CollectiveCheck> check;
  std::shared_ptr<SessionGate> gate;
  std::optional<SamplerLink> sampler;
  std::optional<DdpLink> ddp;
  std::optional<StepDriver> driver;

  // Reports (joined only).
  uint64_t reported_steps = 0;
  // The generation whose reports carried the parameter digests' names.
  std::optional<uint64_t> digest_names_sent;
  absl::Time last_report;
  v1::ReductionStatus last_reduction;
  bool finished = false;
  // Exceptions in flight when the session began: more at its end means the
  // program is leaving by one.
  int uncaught_at_start = std::uncaught_exceptions();

  // Elastic (joined only).
  std::optional<ElasticState> elastic;
  // The last step every rank completed, and where the data stood after it.
  TrainingProgress committed;
  // The state this rank offers the next generation (state_codec.h), frozen
  // when the step in flight failed or the re-formation began.
  std::optional<absl::StatusOr<std::string>> offered;
  // See SawEnd(); cleared once re-formed.
  bool saw_end = false;
  // The last state taken up ended the sampler's pass; see
  // AtSamplersStepBoundary.
  bool state_ended_pass = false;
  bool skip_cut_short = false;

  // DDP_INDEX_LOG (a path): one JSON line per batch the sampler hands out,
  // written before the batch trains, as ddp-worker --index_log writes them
  // (tests/chaos/coverage.py checks every sample is trained once).
  void LogBatch(const std::vector<size_t>& batch, uint64_t epoch);
  // A line saying where a re-formed generation goes on from (earlier lines
  // of later steps were undone).
  void LogGenerationStart();
  // Opens DDP_INDEX_LOG once; whether there is one.
  bool OpenIndexLog();
  std::optional<LineFile> index_log;
  bool index_log_looked_up = false;

  // Every rank takes the state of rank `source` (state_transfer.h); then
  // the sampler goes on from where it stood there.
  void TakeUpState(int source);

 private:
  absl::StatusOr<std::string> EncodeState();
  StateParts ElasticParts() const;
  StateIdentity ElasticIdentity() const;
};

}  // namespace ddp

#endif  // DDP_WORKER_API_SESSION_IMPL_H_
