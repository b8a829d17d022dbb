#include "worker/elastic/state_transfer.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ddp {

absl::StatusOr<std::string> BroadcastState(Communicator& comm, int source,
                                           absl::StatusOr<std::string> mine, uint64_t max_bytes) {
  const bool is_source = comm.rank() == source;
  std::string bytes;
  // The source says whether it has a state (and how big) before anything
  // else moves: its failure must reach every rank. 0: none.
  uint64_t size = 0;
  if (is_source && mine.ok()) {
    bytes = std::move(*mine);
    size = bytes.size();
  }
  if (absl::Status s = comm.Broadcast(&size, sizeof(size), source); !s.ok()) return s;
  if (is_source && !mine.ok()) return mine.status();
  if (size == 0) {
    return absl::UnavailableError(absl::StrCat("rank ", source, " could not provide the state"));
  }
  // A peer's word is not believed before anything is allocated on it; every
  // rank checks the same number, so they refuse together.
  if (size > max_bytes) {
    return absl::DataLossError(absl::StrCat("rank ", source, " announced a state of ", size,
                                            " bytes, more than this job's model can hold (",
                                            max_bytes, "): refused before allocating"));
  }
  if (!is_source) bytes.resize(size);
  if (absl::Status s = comm.Broadcast(bytes.data(), size, source); !s.ok()) return s;
  return bytes;
}

}  // namespace ddp
