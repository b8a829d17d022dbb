// The coordinator's decisions about generations, as pure functions of its
// state and the time: when to form one (or wait, or fail the job, or pause
// the running one to admit joiners), who its members are, whose state it
// starts from, the learning rate it trains with and what each member is
// told, which members are hung, whether a failure is a fault another
// generation can cure, whether the fault budget is spent, and whether a
// restarted coordinator can adopt the generation that kept training
// without it. The Coordinator
// gathers the inputs under its lock and carries out the answer; these
// functions only decide, so each is tested as a table.
#ifndef DDP_COORDINATOR_REFORM_POLICY_H_
#define DDP_COORDINATOR_REFORM_POLICY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "coordinator/rank_assignment.h"
#include "ddp/v1/job.pb.h"
#include "ddp/v1/kinds.pb.h"
#include "ddp/v1/status.pb.h"
#include "ddp/v1/worker.pb.h"

namespace ddp {

struct Generation;  // generation_manager.h

// ---- When to form a generation -------------------------------------------

enum class Formation {
  kWait,
  // Form a generation from the free workers now.
  kForm,
  // Ask the running generation's members to leave at the next step
  // boundary, so that joiners can be admitted without losing a step.
  kAdmitJoiners,
  // Give up: the job fails with the decision's reason.
  kFail,
};

struct FormationInput {
  // WAITING (no generation yet), RUNNING or RECOVERING.
  v1::JobState job_state = v1::JOB_STATE_UNSPECIFIED;
  bool generation_running = false;
  // World size of the running generation.
  uint32_t world_size = 0;
  // Attached, idle workers able to run the job, holding its state.
  uint32_t free_workers = 0;
  // Free workers still building the job's state.
  uint32_t preparing_workers = 0;
  // WAITING: how long the first generation waits for them.
  absl::Duration prepare_timeout;
  // Attached members of the last generation that have not left it yet.
  uint32_t leaving_members = 0;
  uint32_t min_workers = 1;
  uint32_t max_workers = 1;
  absl::Duration settle;
  absl::Duration rejoin_timeout;
  absl::Duration reform_min_interval;
  // WAITING: since when min_workers have been free (unset while fewer).
  std::optional<absl::Time> quorum_since;
  // RECOVERING: when the last generation ended.
  absl::Time recovering_since;
  // When the latest generation formed.
  absl::Time last_formed_at;
  absl::Time now;
};

struct FormationDecision {
  Formation what = Formation::kWait;
  // For operators: what the job waits for, or why it fails.
  std::string why;
};

// WAITING: form once max_workers are free, or min_workers have been for the
// settle window and none is still preparing (for at most prepare_timeout:
// every worker attached at the start trains in the first generation, as
// when they built their state at the rendezvous). RECOVERING: once every leaving member has left,
// form at once with min_workers, else wait up to rejoin_timeout, then fail. RUNNING: admit free
// workers when the world is below max_workers and the last generation formed at least
// reform_min_interval ago.
FormationDecision DecideFormation(const FormationInput& in);

// ---- Who, and from whose state -------------------------------------------

// A free worker that may become a member.
struct Candidate {
  RankCandidate slot;
  // The job's state the worker holds in memory, if any (same job and spec).
  std::optional<v1::HeldState> held;
};

// Up to `max_workers` candidates in rank order. When there are more, those
// holding the job's state are taken first (the newest first, by generation
// then step, so no progress is thrown away and no running member gives way
// to a joiner), then the rest in rank order.
std::vector<Candidate> ChooseMembers(std::vector<Candidate> candidates, uint32_t max_workers);

struct SourceInput {
  // The new generation's members, in rank order.
  const std::vector<Candidate>* members = nullptr;
  // The newest checkpoint rank 0 reported, if any: its step, and the
  // generation that wrote it.
  std::optional<uint64_t> checkpoint_step;
  uint64_t checkpoint_generation = 0;
  // The most advanced step any rank committed in the job so far.
  uint64_t committed_step = 0;
};

struct SourceChoice {
  uint32_t rank = 0;
  v1::StateSource source = v1::STATE_SOURCE_FRESH;
  // Where the state stands (as the coordinator knows it; the state itself
  // decides, and a checkpoint that turns out corrupt may be older).
  uint64_t step = 0;
  uint64_t epoch = 0;
  uint64_t cursor = 0;
  // Committed steps the new generation does not start from.
  uint64_t steps_lost = 0;
};

// The newest state wins, by (generation, step): a member's memory (ties:
// the lowest rank), unless the newest checkpoint is newer, in which case
// rank 0 loads it; with neither, fresh weights at step 0.
SourceChoice ChooseSource(const SourceInput& in);

// ---- What the members are told --------------------------------------------

// The learning rate a generation of `world_size` members trains with: the
// spec's `base_lr` with lr_scaling "keep"; with "linear", scaled by
// world_size / max_workers (the lr follows the global batch, which is
// max_workers' at the spec's lr).
double ScaledLr(double base_lr, v1::LrScaling lr_scaling, uint32_t world_size,
                uint32_t max_workers);

// What the job tells every member of a generation.
struct AssignmentJob {
  std::string job_id;
  const v1::JobSpec* spec = nullptr;
  // Epochs already evaluated (a re-formed generation does not repeat them).
  uint64_t evaluated_epochs = 0;
};

// Rank `rank`'s Assignment in `g`: its place in the world and on its
// machine, where the state starts, the lr, and its own store token.
v1::Assignment BuildAssignment(const Generation& g, uint32_t rank, const AssignmentJob& job);

// ---- Faults ---------------------------------------------------------------

enum class FailureKind {
  // A peer or the network failed (UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED,
  // CANCELLED): another generation can cure it.
  kFault,
  // Anything else (a bad model or data file, diverged replicas): another
  // generation would fail the same way, so the job fails.
  kFatal,
};

// What a worker's failure, as the code of its StateChange says, is.
FailureKind ClassifyFailure(absl::StatusCode code);

struct FaultOutcome {
  // The fault budget is spent: the job fails instead of re-forming.
  bool fail_job = false;
  // For operators: the fault's reason, and why the job fails if it does.
  std::string reason;
};

// A generation lost to the job's `faults`-th fault (this one counted): it
// re-forms while faults <= budget, else the job fails.
FaultOutcome DecideFault(uint32_t faults, uint32_t budget, const std::string& reason);

// ---- Hung members ---------------------------------------------------------

struct MemberActivity {
  std::string worker_id;
  int rank = 0;
  // Steps completed, and when that number last grew (or the generation
  // started).
  uint64_t step = 0;
  absl::Time advanced_at;
  v1::StepPhase phase = v1::STEP_PHASE_UNSPECIFIED;
  // A bound of the phase's own (an evaluation's), from when the step last
  // advanced; zero: none.
  absl::Duration phase_bound;
};

struct HangVerdict {
  // Members to evict, in rank order.
  std::vector<std::string> evict;
  // Every member is stuck in a collective at the same step: no culprit can
  // be named, so the generation is re-formed with the same workers.
  bool reform_all = false;
  // For operators: who is stuck, where, for how long.
  std::string reason;
};

// The threshold after which a member that stopped advancing is hung:
// max(hang_timeout, 10 × the median step time).
absl::Duration HangThreshold(absl::Duration hang_timeout, absl::Duration median_step);

// Once a member has not advanced for longer than `threshold`: in
// synchronous training a stuck rank stalls every other in its next
// collective, so the culprits are the members (stuck past the threshold
// themselves or not yet) that are furthest behind and outside a collective
// (data, forward, optimizer, evaluation); the rest only wait for them. With
// nobody outside a collective, the ones behind the others; with everyone
// level and waiting, nobody can be named. A culprit in a phase with a bound
// of its own (evaluating) is hung only past max(threshold, that bound):
// until then the others wait for it by design, and nobody is.
HangVerdict FindHungMembers(const std::vector<MemberActivity>& members, absl::Duration threshold,
                            absl::Time now);

// ---- Adoption after a coordinator restart ---------------------------------

enum class Adoption {
  // Keep waiting for members to come back.
  kWait,
  // Every member came back claiming the generation: it goes on untouched.
  kAdopt,
  // The generation can't go on (a member is missing past the grace window,
  // or came back having left it): end it and re-form from the members' state.
  kGiveUp,
};

struct AdoptionInput {
  uint32_t members = 0;
  // Members that re-attached claiming the generation and their own rank.
  uint32_t returned = 0;
  // Members that re-attached having left the generation.
  uint32_t returned_idle = 0;
  absl::Time deadline;
  absl::Time now;
};

Adoption DecideAdoption(const AdoptionInput& in);

}  // namespace ddp

#endif  // DDP_COORDINATOR_REFORM_POLICY_H_
