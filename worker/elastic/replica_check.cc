#include "worker/elastic/replica_check.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ddp {
namespace {

using Named = std::vector<std::pair<std::string, at::Tensor>>;

// More than any model's list of names and shapes: a longer announcement is
// a lie, refused before a byte of it is allocated.
constexpr uint64_t kMaxListBytes = uint64_t{64} << 20;

std::string Describe(const std::string& name, const at::Tensor& t) {
  return absl::StrCat(name, " [", absl::StrJoin(t.sizes(), ", "), "]");
}

}  // namespace

absl::Status CheckSameModel(Communicator& comm, const Named& params, const Named& buffers,
                            int root) {
  std::vector<std::string> mine;
  for (const auto& [name, t] : params) mine.push_back(Describe(name, t));
  for (const auto& [name, t] : buffers) {
    mine.push_back(absl::StrCat("buffer ", Describe(name, t), " ", std::string(t.dtype().name())));
  }
  // Rank root's list (name and shape of each) reaches every rank, which
  // compares it with its own; then every rank learns where each rank first
  // differs, so they all fail at once and each names the parameter.
  const std::string text = absl::StrJoin(mine, "\n");
  uint64_t size = text.size();
  if (absl::Status s = comm.Broadcast(&size, sizeof(size), root); !s.ok()) return s;
  if (size > kMaxListBytes) {
    return absl::DataLossError(absl::StrCat("rank ", root, " announced a parameter list of ", size,
                                            " bytes: refused before allocating"));
  }
  std::string theirs = comm.rank() == root ? text : std::string(size, '\0');
  if (absl::Status s = comm.Broadcast(theirs.data(), size, root); !s.ok()) return s;
  std::vector<std::string> reference =
      theirs.empty() ? std::vector<std::string>{} : absl::StrSplit(theirs, '\n');
  size_t first = 0;  // 0: same; i + 1: differs at position i
  for (size_t i = 0; i < std::max(mine.size(), reference.size()); ++i) {
    if (i >= mine.size() || i >= reference.size() || mine[i] != reference[i]) {
      first = i + 1;
      break;
    }
  }
  std::vector<float> differs(comm.world_size(), 0.0f);
  differs[comm.rank()] = static_cast<float>(first);
  if (absl::Status s = comm.AllReduceSum(differs.data(), differs.size()); !s.ok()) return s;
  std::vector<std::string> ranks;
  for (int r = 0; r < comm.world_size(); ++r) {
    if (differs[r] == 0) continue;
    const size_t at = static_cast<size_t>(std::lround(differs[r])) - 1;
    ranks.push_back(absl::StrCat("rank ", r, " at parameter #", at, " (rank ", root, " has ",
                                 at < reference.size() ? reference[at] : "no more parameters",
                                 ")"));
  }
  if (ranks.empty()) return absl::OkStatus();
  const std::string here = first == 0                ? "same as rank " + std::to_string(root)
                           : first - 1 < mine.size() ? mine[first - 1]
                                                     : "no more parameters";
  return absl::InvalidArgumentError(
      absl::StrCat("the ranks' models differ: ", absl::StrJoin(ranks, "; "), ". This rank (",
                   comm.rank(), ") has ", here, ". Every rank must build the same model"));
}

}  // namespace ddp
