#include "worker/collective/collective_check.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ddp {
namespace {

constexpr char kMisalignedUrl[] = "type.ddp/collectives-misaligned";
// The hash's 16 hex digits, then their squares.
constexpr size_t kDigits = 16;
// Per rank on a mismatch: kind, root + 1, then count, extra, bytes_after,
// sequence and steps in 16-bit pieces (floats hold them exactly, and sums
// with zeros).
constexpr size_t kPieces = 4;
constexpr size_t kFields = 2 + 5 * kPieces;

uint64_t Mix(uint64_t h, uint64_t v) {
  // splitmix64's finalizer over the running value.
  uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t Hash(const AnnouncedCollective& c) {
  uint64_t h = 0;
  for (uint64_t v : {static_cast<uint64_t>(c.collective.kind), c.collective.count,
                     c.collective.extra, static_cast<uint64_t>(c.collective.root + 1),
                     c.collective.bytes_after, c.sequence, c.steps}) {
    h = Mix(h, v);
  }
  return h;
}

void Pack(uint64_t v, float* out) {
  for (size_t i = 0; i < kPieces; ++i) out[i] = static_cast<float>((v >> (16 * i)) & 0xffff);
}

uint64_t Unpack(const float* in) {
  uint64_t v = 0;
  for (size_t i = 0; i < kPieces; ++i) {
    v |= static_cast<uint64_t>(std::lround(in[i])) << (16 * i);
  }
  return v;
}

std::string Plural(uint64_t n, const char* one, const char* many) {
  return absl::StrCat(n, " ", n == 1 ? one : many);
}

std::string RankList(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "));
}

}  // namespace

std::string DescribeCollective(const AnnouncedCollective& a) {
  const Collective& c = a.collective;
  const std::string after = a.steps == 0 ? " before any synchronized backward"
                                         : absl::StrCat(" after synchronized backward #", a.steps);
  // Decoded from a peer's floats: any value may come.
  std::string what = absl::StrCat("collective kind ", static_cast<uint32_t>(c.kind));
  switch (c.kind) {
    case CollectiveKind::kGradients:
      return absl::StrCat(
          "collective #", a.sequence + 1, ": the gradients of synchronized backward #", a.steps + 1,
          " (", Plural(c.extra, "bucket", "buckets"), ", ", Plural(c.count, "float", "floats"),
          c.bytes_after == 0 ? ""
                             : absl::StrCat("; then ", Plural(c.bytes_after, "byte", "bytes"),
                                            " of buffers from rank ", c.root),
          ")");
    case CollectiveKind::kBucketOrder:
      what = absl::StrCat("the rebuild of the gradient buckets (",
                          Plural(c.count, "parameter", "parameters"), ")");
      break;
    case CollectiveKind::kModel:
      what = absl::StrCat("constructing a DistributedDataParallel from rank ", c.root);
      break;
    case CollectiveKind::kAllReduce:
      what = absl::StrCat("all_reduce_sum of ", Plural(c.count, "float", "floats"));
      break;
    case CollectiveKind::kBroadcast:
      what = absl::StrCat("broadcast of ", Plural(c.count, "byte", "bytes"), " from rank ", c.root);
      break;
    case CollectiveKind::kBarrier:
      what = "barrier";
      break;
    case CollectiveKind::kState:
      what = absl::StrCat("taking up rank ", c.root, "'s elastic state");
      break;
  }
  return absl::StrCat("collective #", a.sequence + 1, ": ", what, after);
}

absl::Status MisalignedError(const std::vector<AnnouncedCollective>& by_rank) {
  // Ranks grouped by what they announced, in order of their lowest rank.
  std::vector<std::pair<AnnouncedCollective, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(by_rank.size()); ++r) {
    auto it = groups.begin();
    while (it != groups.end() && !(it->first == by_rank[r])) ++it;
    if (it == groups.end()) {
      groups.push_back({by_rank[r], {r}});
    } else {
      it->second.push_back(r);
    }
  }
  constexpr size_t kShown = 8;
  std::vector<std::string> parts;
  for (size_t i = 0; i < groups.size() && i < kShown; ++i) {
    std::vector<int> ranks = groups[i].second;
    std::string listed = ranks.size() > kShown
                             ? absl::StrCat(RankList({ranks.begin(), ranks.begin() + kShown}),
                                            " and ", ranks.size() - kShown, " more")
                             : RankList(ranks);
    parts.push_back(absl::StrCat(listed, " at ", DescribeCollective(groups[i].first)));
  }
  if (groups.size() > kShown) parts.push_back(absl::StrCat(groups.size() - kShown, " more"));
  absl::Status status = absl::FailedPreconditionError(absl::StrCat(
      "the ranks' collectives are misaligned: ", absl::StrJoin(parts, "; "),
      ". Every rank must run the same collectives in the same order: the same synchronized "
      "backwards (one whose loss reaches no parameter still counts), the same no_sync() "
      "micro-batches, and the same all_reduce_sum, broadcast and barrier calls"));
  status.SetPayload(kMisalignedUrl, absl::Cord("1"));
  return status;
}

bool IsMisaligned(const absl::Status& status) {
  return status.GetPayload(kMisalignedUrl).has_value();
}

absl::Status CollectiveCheck::Agree(const Collective& collective) {
  AnnouncedCollective mine{collective, 0, 0};
  {
    absl::MutexLock lock(&mu_);
    mine.sequence = sequence_++;
    mine.steps = steps_;
    if (collective.kind == CollectiveKind::kGradients) ++steps_;
  }
  const int world = comm_->world_size();
  if (world == 1 || comm_->backend() == "nccl") return absl::OkStatus();
  const uint64_t hash = Hash(mine);
  float digits[2 * kDigits];
  for (size_t i = 0; i < kDigits; ++i) {
    const float d = static_cast<float>((hash >> (4 * i)) & 0xf);
    digits[i] = d;
    digits[kDigits + i] = d * d;
  }
  float sums[2 * kDigits];
  std::copy(digits, digits + 2 * kDigits, sums);
  if (absl::Status s = comm_->AllReduceSum(sums, 2 * kDigits); !s.ok()) return s;
  // Sums of at most world x 225: exact in float for any world this runs.
  bool agreed = true;
  for (size_t i = 0; i < 2 * kDigits; ++i) {
    agreed = agreed && sums[i] == digits[i] * static_cast<float>(world);
  }
  if (agreed) return absl::OkStatus();
  // Every rank saw a difference: they all exchange what they announced.
  std::vector<float> all(kFields * world, 0.0f);
  float* slot = all.data() + kFields * comm_->rank();
  slot[0] = static_cast<float>(static_cast<uint32_t>(collective.kind));
  slot[1] = static_cast<float>(collective.root + 1);
  Pack(mine.collective.count, slot + 2);
  Pack(mine.collective.extra, slot + 2 + kPieces);
  Pack(mine.collective.bytes_after, slot + 2 + 2 * kPieces);
  Pack(mine.sequence, slot + 2 + 3 * kPieces);
  Pack(mine.steps, slot + 2 + 4 * kPieces);
  if (absl::Status s = comm_->AllReduceSum(all.data(), all.size()); !s.ok()) return s;
  std::vector<AnnouncedCollective> by_rank(world);
  for (int r = 0; r < world; ++r) {
    const float* in = all.data() + kFields * r;
    AnnouncedCollective& a = by_rank[r];
    a.collective.kind = static_cast<CollectiveKind>(std::lround(in[0]));
    a.collective.root = static_cast<int32_t>(std::lround(in[1])) - 1;
    a.collective.count = Unpack(in + 2);
    a.collective.extra = Unpack(in + 2 + kPieces);
    a.collective.bytes_after = Unpack(in + 2 + 2 * kPieces);
    a.sequence = Unpack(in + 2 + 3 * kPieces);
    a.steps = Unpack(in + 2 + 4 * kPieces);
  }
  return MisalignedError(by_rank);
}

}  // namespace ddp
