#include "common/coordinator_targets.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/net_address.h"
#include "common/quote.h"

namespace ddp {
namespace {

// Entries as written, spaces around them dropped; empty ones kept.
std::vector<std::string> Split(absl::string_view list) {
  std::vector<std::string> out;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    out.emplace_back(absl::StripAsciiWhitespace(entry));
  }
  return out;
}

absl::Status CheckAddress(absl::string_view address) {
  if (absl::StartsWith(address, "unix:")) {
    if (address.size() > 5) return absl::OkStatus();
    return absl::InvalidArgumentError("\"unix:\" names no socket (unix:PATH)");
  }
  return ParseHostPort(address).status();
}

}  // namespace

std::string LeaderHint(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  const auto it = trailers.find(kLeaderMetadata);
  if (it == trailers.end()) return "";
  const std::string hint(
      absl::StripAsciiWhitespace(absl::string_view(it->second.data(), it->second.size())));
  // A coordinator's word, but still bytes off the wire: only an address is
  // followed.
  if (hint.empty() || !CheckAddress(hint).ok()) return "";
  return hint;
}

absl::StatusOr<std::vector<std::string>> ParseCoordinatorList(absl::string_view list) {
  std::vector<std::string> addresses = Split(list);
  for (size_t i = 0; i < addresses.size(); ++i) {
    const std::string where =
        addresses.size() == 1 ? "" : absl::StrCat("entry ", i + 1, " of ", addresses.size(), ": ");
    if (addresses[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "no address in ", Quote(list),
                       " (a comma list of HOST:PORT, e.g. 10.0.0.1:29400,10.0.0.2:29400)"));
    }
    if (absl::Status s = CheckAddress(addresses[i]); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, s.message()));
    }
    if (std::find(addresses.begin(), addresses.begin() + i, addresses[i]) !=
        addresses.begin() + i) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, Quote(addresses[i]), " is listed twice"));
    }
  }
  return addresses;
}

CoordinatorTargets::CoordinatorTargets(absl::string_view list)
    : addresses_([list] {
        std::vector<std::string> addresses = Split(list);
        addresses.erase(std::remove(addresses.begin(), addresses.end(), ""), addresses.end());
        // Nothing listed: calls to it fail as they always did.
        if (addresses.empty()) addresses.emplace_back(list);
        return addresses;
      }()),
      current_(addresses_.front()) {}

std::string CoordinatorTargets::current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

CoordinatorTargets::Next CoordinatorTargets::OnFailure(absl::string_view tried,
                                                       const grpc::Status& status,
                                                       const grpc::ClientContext& context) {
  const grpc::StatusCode code = status.error_code();
  const std::string leader = code == grpc::StatusCode::UNAVAILABLE ? LeaderHint(context) : "";
  absl::MutexLock lock(&mu_);
  // A standby naming itself knows no better than one naming nobody.
  if (!leader.empty() && leader != tried) {
    current_ = leader;
    const auto listed = std::find(addresses_.begin(), addresses_.end(), leader);
    if (listed != addresses_.end()) index_ = listed - addresses_.begin();
    return Next{current_, Move::kLeader};
  }
  if (code != grpc::StatusCode::UNAVAILABLE && code != grpc::StatusCode::DEADLINE_EXCEEDED) {
    return Next{current_, Move::kStay};
  }
  return AdvanceLocked(tried);
}

CoordinatorTargets::Next CoordinatorTargets::OnUnreachable(absl::string_view tried) {
  absl::MutexLock lock(&mu_);
  return AdvanceLocked(tried);
}

void CoordinatorTargets::OnSuccess() {
  absl::MutexLock lock(&mu_);
  moves_in_round_ = 0;
}

CoordinatorTargets::Next CoordinatorTargets::AdvanceLocked(absl::string_view tried) {
  // Two callers that failed on the same target move once between them.
  if (tried != current_) return Next{current_, Move::kNextAddress};
  index_ = (index_ + 1) % addresses_.size();
  current_ = addresses_[index_];
  if (++moves_in_round_ < addresses_.size()) return Next{current_, Move::kNextAddress};
  moves_in_round_ = 0;
  return Next{current_, Move::kNewRound};
}

}  // namespace ddp
