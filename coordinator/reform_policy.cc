#include "coordinator/reform_policy.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/generation_manager.h"

namespace ddp {
namespace {

std::string Workers(uint32_t n) { return absl::StrCat(n, n == 1 ? " worker" : " workers"); }

// Phases in which a rank waits for its peers rather than computing.
bool InCollective(v1::StepPhase phase) {
  return phase == v1::STEP_PHASE_BACKWARD || phase == v1::STEP_PHASE_ALLREDUCE_WAIT ||
         phase == v1::STEP_PHASE_SYNC || phase == v1::STEP_PHASE_EVALUATE_WAIT;
}

// How long `m` may go without advancing.
absl::Duration OwnThreshold(const MemberActivity& m, absl::Duration threshold) {
  return std::max(threshold, m.phase_bound);
}

// Whether state `a` is newer than `b`: by generation, then step.
bool Newer(const v1::HeldState& a, const v1::HeldState& b) {
  if (a.generation() != b.generation()) return a.generation() > b.generation();
  return a.step() > b.step();
}

std::string PhaseName(v1::StepPhase phase) {
  std::string name = v1::StepPhase_Name(phase);
  if (absl::StartsWith(name, "STEP_PHASE_")) name = name.substr(11);
  absl::AsciiStrToLower(&name);
  return name;
}

// ", 2 still preparing" when some workers are building the job's state.
std::string Preparing(const FormationInput& in) {
  if (in.preparing_workers == 0) return "";
  return absl::StrCat(", ", in.preparing_workers, " still preparing");
}

}  // namespace

FormationDecision DecideFormation(const FormationInput& in) {
  const absl::Time now = in.now;
  switch (in.job_state) {
    case v1::JOB_STATE_WAITING: {
      if (in.free_workers < in.min_workers) {
        // "(4 attached: 1 ready, 3 still preparing)": every worker the job
        // holds is attached, ready or not.
        const std::string held =
            in.preparing_workers == 0
                ? absl::StrCat(in.free_workers, " attached")
                : absl::StrCat(in.free_workers + in.preparing_workers,
                               " attached: ", in.free_workers, " ready", Preparing(in));
        return {Formation::kWait,
                absl::StrCat("waiting for ", Workers(in.min_workers), " (", held, ")")};
      }
      if (in.free_workers >= in.max_workers) return {Formation::kForm, ""};
      const absl::Time since = in.quorum_since.value_or(now);
      if (in.preparing_workers > 0 && now - since < in.prepare_timeout) {
        return {Formation::kWait,
                absl::StrFormat("%d of up to %d workers ready%s; forming once they are (at most "
                                "%.0fs more)",
                                in.free_workers, in.max_workers, Preparing(in),
                                absl::ToDoubleSeconds(since + in.prepare_timeout - now))};
      }
      if (now - since >= in.settle) return {Formation::kForm, ""};
      return {
          Formation::kWait,
          absl::StrFormat("%d of up to %d workers attached%s; forming in %.1fs unless more come",
                          in.free_workers, in.max_workers, Preparing(in),
                          absl::ToDoubleSeconds(since + in.settle - now))};
    }
    case v1::JOB_STATE_RUNNING: {
      if (!in.generation_running || in.free_workers == 0 || in.world_size >= in.max_workers) {
        return {Formation::kWait, ""};
      }
      const absl::Time allowed = in.last_formed_at + in.reform_min_interval;
      if (now < allowed) {
        return {Formation::kWait,
                absl::StrFormat("%s waiting to join; admitted in %.1fs", Workers(in.free_workers),
                                absl::ToDoubleSeconds(allowed - now))};
      }
      return {Formation::kAdmitJoiners,
              absl::StrCat("admitting ", Workers(in.free_workers), " at the next step boundary")};
    }
    case v1::JOB_STATE_RECOVERING: {
      if (in.leaving_members > 0) {
        return {Formation::kWait,
                absl::StrCat("waiting for ", in.leaving_members, " member(s) to leave")};
      }
      if (in.free_workers >= in.min_workers && in.free_workers > 0) return {Formation::kForm, ""};
      const absl::Duration waited = now - in.recovering_since;
      if (waited >= in.rejoin_timeout) {
        return {Formation::kFail,
                absl::StrFormat("only %d of the %d workers the job needs (min_workers) were "
                                "attached %.0fs after the last generation ended "
                                "(rejoin_timeout_seconds %.0f); start more workers and submit "
                                "the job again",
                                in.free_workers, in.min_workers, absl::ToDoubleSeconds(waited),
                                absl::ToDoubleSeconds(in.rejoin_timeout))};
      }
      return {Formation::kWait,
              absl::StrFormat("waiting for %d more %s (%d of min_workers %d attached%s); the "
                              "job fails in %.0fs",
                              in.min_workers - in.free_workers,
                              in.min_workers - in.free_workers == 1 ? "worker" : "workers",
                              in.free_workers, in.min_workers, Preparing(in),
                              absl::ToDoubleSeconds(in.rejoin_timeout - waited))};
    }
    default:
      return {Formation::kWait, ""};
  }
}

std::vector<Candidate> ChooseMembers(std::vector<Candidate> candidates, uint32_t max_workers) {
  auto rank_order = [](const Candidate& a, const Candidate& b) {
    return SlotKey(a.slot.host, a.slot.device, a.slot.worker_id) <
           SlotKey(b.slot.host, b.slot.device, b.slot.worker_id);
  };
  if (candidates.size() > max_workers) {
    // Holders of the job's state first, the most advanced first: a running
    // member is never dropped for a stateless joiner, nor progress thrown
    // away. Then rank order.
    std::sort(candidates.begin(), candidates.end(), [&](const Candidate& a, const Candidate& b) {
      if (a.held.has_value() != b.held.has_value()) return a.held.has_value();
      if (a.held && Newer(*a.held, *b.held)) return true;
      if (a.held && Newer(*b.held, *a.held)) return false;
      return rank_order(a, b);
    });
    candidates.resize(max_workers);
  }
  std::sort(candidates.begin(), candidates.end(), rank_order);
  return candidates;
}

SourceChoice ChooseSource(const SourceInput& in) {
  SourceChoice choice;
  int best = -1;
  const std::vector<Candidate>& members = *in.members;
  for (size_t r = 0; r < members.size(); ++r) {
    // A state that never trained (prepared fresh) is no better than fresh
    // weights: starting "fresh" says so.
    const auto& held = members[r].held;
    if (held && held->generation() > 0 && (best < 0 || Newer(*held, *members[best].held))) {
      best = static_cast<int>(r);
    }
  }
  v1::HeldState checkpoint;
  checkpoint.set_generation(in.checkpoint_generation);
  checkpoint.set_step(in.checkpoint_step.value_or(0));
  if (best >= 0 && (!in.checkpoint_step || !Newer(checkpoint, *members[best].held))) {
    const v1::HeldState& held = *members[best].held;
    choice.rank = static_cast<uint32_t>(best);
    choice.source = v1::STATE_SOURCE_MEMORY;
    choice.step = held.step();
    choice.epoch = held.epoch();
    choice.cursor = held.cursor();
  } else if (in.checkpoint_step) {
    choice.rank = 0;
    choice.source = v1::STATE_SOURCE_CHECKPOINT;
    choice.step = *in.checkpoint_step;
  } else {
    choice.rank = 0;
    choice.source = v1::STATE_SOURCE_FRESH;
  }
  choice.steps_lost = in.committed_step > choice.step ? in.committed_step - choice.step : 0;
  return choice;
}

absl::Duration HangThreshold(absl::Duration hang_timeout, absl::Duration median_step) {
  return std::max(hang_timeout, 10 * median_step);
}

HangVerdict FindHungMembers(const std::vector<MemberActivity>& members, absl::Duration threshold,
                            absl::Time now) {
  HangVerdict verdict;
  std::vector<const MemberActivity*> stuck;
  for (const MemberActivity& m : members) {
    if (now - m.advanced_at > OwnThreshold(m, threshold)) stuck.push_back(&m);
  }
  if (stuck.empty()) return verdict;
  // Someone waits too long: look at everyone. The one it waits for may not
  // have crossed the threshold itself yet (its last step came a moment
  // later), but it is behind, or outside the collective the others wait in.
  uint64_t lowest = members.front().step;
  for (const MemberActivity& m : members) lowest = std::min(lowest, m.step);
  std::vector<const MemberActivity*> behind, computing;
  for (const MemberActivity& m : members) {
    if (m.step != lowest) continue;
    behind.push_back(&m);
    if (!InCollective(m.phase)) computing.push_back(&m);
  }
  std::vector<const MemberActivity*> culprits = computing;
  if (culprits.empty() && behind.size() < members.size()) culprits = behind;
  for (const MemberActivity* m : culprits) {
    // Still within a bound of its own (a long evaluation): the others wait
    // for it by design.
    if (m->phase_bound > threshold && now - m->advanced_at <= m->phase_bound) return verdict;
  }
  auto describe = [now](const MemberActivity* m) {
    return absl::StrFormat("rank %d (%s) at step %d in phase %s for %.1fs", m->rank, m->worker_id,
                           m->step, PhaseName(m->phase),
                           absl::ToDoubleSeconds(now - m->advanced_at));
  };
  std::vector<std::string> words;
  if (culprits.empty()) {
    verdict.reform_all = true;
    for (const MemberActivity* m : stuck) words.push_back(describe(m));
    verdict.reason =
        absl::StrCat("every rank is stuck in a collective (", absl::StrJoin(words, "; "),
                     "); re-forming with the same workers");
    return verdict;
  }
  std::sort(culprits.begin(), culprits.end(),
            [](const MemberActivity* a, const MemberActivity* b) { return a->rank < b->rank; });
  for (const MemberActivity* m : culprits) {
    verdict.evict.push_back(m->worker_id);
    words.push_back(describe(m));
  }
  absl::Duration own = threshold;
  for (const MemberActivity* m : culprits) own = std::max(own, OwnThreshold(*m, threshold));
  verdict.reason = absl::StrCat("hung: ", absl::StrJoin(words, "; "),
                                absl::StrFormat(" (threshold %.1fs)", absl::ToDoubleSeconds(own)));
  return verdict;
}

Adoption DecideAdoption(const AdoptionInput& in) {
  if (in.returned_idle > 0) return Adoption::kGiveUp;
  if (in.returned >= in.members) return Adoption::kAdopt;
  if (in.now >= in.deadline) return Adoption::kGiveUp;
  return Adoption::kWait;
}

double ScaledLr(double base_lr, v1::LrScaling lr_scaling, uint32_t world_size,
                uint32_t max_workers) {
  switch (lr_scaling) {
    case v1::LR_SCALING_UNKNOWN:  // refused by the job's check
    case v1::LR_SCALING_KEEP:
      return base_lr;
    case v1::LR_SCALING_LINEAR:
      return base_lr * world_size / std::max(1u, max_workers);
  }
  return base_lr;
}

v1::Assignment BuildAssignment(const Generation& g, uint32_t rank, const AssignmentJob& job) {
  v1::Assignment a;
  a.set_job_id(job.job_id);
  a.set_generation(g.number);
  a.set_rank(rank);
  a.set_world_size(static_cast<uint32_t>(g.members.size()));
  a.set_start_epoch(g.source.epoch);
  a.set_start_step(g.source.step);
  a.set_start_cursor(g.source.cursor);
  a.set_sampler_seed(job.spec->seed());
  a.set_source_rank(g.source.rank);
  a.set_state_source(g.source.source);
  a.set_lr(g.lr);
  *a.mutable_spec() = *job.spec;
  a.set_worker_id(g.members[rank].worker_id);
  a.set_single_machine(g.single_machine);
  a.set_own_gpus(g.why_not_own_gpus.empty());
  a.set_own_gpus_why_not(g.why_not_own_gpus);
  const int machine = g.MachineOf(static_cast<int>(rank));
  a.set_machine(static_cast<uint32_t>(machine));
  a.set_local_rank(rank - g.machine_starts[machine]);
  a.set_local_size(g.MachineSize(machine));
  a.set_machines(static_cast<uint32_t>(g.machine_starts.size() - 1));
  a.set_max_local_size(g.LargestMachine());
  a.set_evaluated_epochs(job.evaluated_epochs);
  a.set_store_token(g.store_tokens[rank]);
  return a;
}

FailureKind ClassifyFailure(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
      return FailureKind::kFault;
    default:
      return FailureKind::kFatal;
  }
}

FaultOutcome DecideFault(uint32_t faults, uint32_t budget, const std::string& reason) {
  if (faults <= budget) return FaultOutcome{false, reason};
  return FaultOutcome{true,
                      absl::StrFormat("%s; the job's fault budget (%d) is spent", reason, budget)};
}

}  // namespace ddp
