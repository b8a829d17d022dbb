#include "coordinator/generation_manager.h"

#include <algorithm>

#include "common/tokens.h"

namespace ddp {

int Generation::RankOf(const std::string& worker_id) const {
  auto it = rank_of.find(worker_id);
  return it == rank_of.end() ? -1 : it->second;
}

void Generation::IndexMembers() {
  rank_of.clear();
  rank_of.reserve(members.size());
  machine_starts.clear();
  for (size_t r = 0; r < members.size(); ++r) {
    rank_of.emplace(members[r].worker_id, static_cast<int>(r));
    const std::string& id = members[r].machine_id;
    if (r == 0 || id.empty() || id != members[r - 1].machine_id) {
      machine_starts.push_back(static_cast<int>(r));
    }
  }
  machine_starts.push_back(static_cast<int>(members.size()));
}

int Generation::MachineOf(int rank) const {
  const auto next = std::upper_bound(machine_starts.begin(), machine_starts.end(), rank);
  return static_cast<int>(next - machine_starts.begin()) - 1;
}

int Generation::LargestMachine() const {
  int largest = 0;
  for (size_t m = 0; m + 1 < machine_starts.size(); ++m) {
    largest = std::max(largest, MachineSize(static_cast<int>(m)));
  }
  return largest;
}

std::vector<std::string> Generation::MemberIds() const {
  std::vector<std::string> ids;
  ids.reserve(members.size());
  for (const RankCandidate& m : members) ids.push_back(m.worker_id);
  return ids;
}

const Generation& GenerationManager::Form(std::vector<RankCandidate> members,
                                          const SourceChoice& source, double lr,
                                          absl::flat_hash_set<std::string> joiners) {
  Generation g;
  g.number = ++latest_;
  g.members = std::move(members);
  g.joiners = std::move(joiners);
  g.IndexMembers();
  for (size_t r = 0; r < g.members.size(); ++r) g.store_tokens.push_back(RandomToken());
  g.source = source;
  g.lr = lr;
  g.single_machine = !g.members.empty();
  for (const RankCandidate& m : g.members) {
    g.single_machine &= !m.machine_id.empty() && m.machine_id == g.members[0].machine_id;
  }
  g.why_not_own_gpus = WhyNotOwnGpus(g.members);
  g.formed_at = clock_->Now();
  current_ = g;
  last_ = g;
  return *current_;
}

void GenerationManager::RestoreCurrent(const v1::DurableGeneration& saved) {
  Generation g;
  g.number = saved.number();
  for (const v1::DurableMember& m : saved.members()) {
    Device device;
    if (auto parsed = ParseDevice(m.device()); parsed.ok()) device = *parsed;
    g.members.push_back(RankCandidate{m.worker_id(), m.host(), device, m.machine_id()});
    // A state saved by an older build has none: the members' rendezvous is
    // long over, and a fresh token keeps the store closed to others.
    g.store_tokens.push_back(m.store_token().empty() ? RandomToken() : m.store_token());
  }
  g.IndexMembers();
  g.source.rank = saved.source_rank();
  g.source.source = saved.state_source();
  g.source.step = saved.start_step();
  g.source.epoch = saved.start_epoch();
  g.source.cursor = saved.start_cursor();
  g.lr = saved.lr();
  g.single_machine = saved.single_machine();
  g.why_not_own_gpus = WhyNotOwnGpus(g.members);
  g.formed_at = clock_->Now();
  latest_ = std::max(latest_, g.number);
  current_ = g;
  last_ = g;
}

void GenerationManager::FillDurable(v1::DurableGeneration* out) const {
  if (!current_) return;
  const Generation& g = *current_;
  out->set_number(g.number);
  for (size_t r = 0; r < g.members.size(); ++r) {
    const RankCandidate& m = g.members[r];
    v1::DurableMember* d = out->add_members();
    d->set_worker_id(m.worker_id);
    d->set_host(m.host);
    d->set_device(m.device.ToString());
    d->set_machine_id(m.machine_id);
    d->set_store_token(g.store_tokens[r]);
  }
  out->set_start_step(g.source.step);
  out->set_start_epoch(g.source.epoch);
  out->set_start_cursor(g.source.cursor);
  out->set_source_rank(g.source.rank);
  out->set_state_source(g.source.source);
  out->set_lr(g.lr);
  out->set_single_machine(g.single_machine);
}

}  // namespace ddp
