// Shared-memory segments are not left in /dev/shm by a rank stopped during
// the rendezvous: rank 0 holds the segment's name until every rank mapped
// it, and a SIGTERM (or SIGINT) then unlinks it before the process ends.
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"
#include "worker/collective/shm_communicator.h"

namespace ddp {
namespace {

// The names in /dev/shm of segments `pid` created.
std::vector<std::string> SegmentsOf(pid_t pid) {
  std::vector<std::string> out;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return out;
  const std::string prefix = absl::StrCat("ddp-", pid, "-");
  while (const dirent* entry = ::readdir(dir)) {
    if (absl::StartsWith(entry->d_name, prefix)) out.emplace_back(entry->d_name);
  }
  ::closedir(dir);
  return out;
}

// Rank 0 of 2 in a child, waiting for rank 1 with its segment made; -1
// when it made none.
pid_t RankZeroWithItsSegment() {
  const pid_t child = ::fork();
  if (child == 0) {
    // Rank 0 of 2: creates the segment, then waits for rank 1, which never
    // comes.
    gloo::rendezvous::HashStore store;
    ShmCommunicator::Options options;
    options.rank = 0;
    options.world_size = 2;
    options.timeout = absl::Seconds(60);
    options.slot_bytes = 1 << 20;
    (void)ShmCommunicator::Create(store, options);
    ::_exit(0);
  }
  if (child < 0) return -1;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (SegmentsOf(child).empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  if (!SegmentsOf(child).empty()) return child;
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  return -1;
}

void StoppedInTheRendezvous_NothingLeft(int sig) {
  const pid_t child = RankZeroWithItsSegment();
  ASSERT_GT(child, 0) << "rank 0 made no segment";
  ASSERT_EQ(::kill(child, sig), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  // It died of the signal, as it would have without the handler.
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), sig);
  EXPECT_TRUE(SegmentsOf(child).empty());
}

TEST(ShmSegment, RankZeroSigtermedInTheRendezvous_NothingLeftInDevShm) {
  StoppedInTheRendezvous_NothingLeft(SIGTERM);
}

TEST(ShmSegment, RankZeroInterruptedInTheRendezvous_NothingLeftInDevShm) {
  StoppedInTheRendezvous_NothingLeft(SIGINT);
}

// kill -9 leaves the segment; the next rendezvous on the machine removes
// it, even while the killed rank is a zombie its parent has not reaped.
TEST(ShmSegment, RankZeroKilled_TheNextRendezvousRemovesItsSegmentEvenUnreaped) {
  const pid_t child = RankZeroWithItsSegment();
  ASSERT_GT(child, 0) << "rank 0 made no segment";
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  siginfo_t info{};
  // Dead, not reaped: WNOWAIT leaves it a zombie.
  ASSERT_EQ(::waitid(P_PID, child, &info, WEXITED | WNOWAIT), 0);
  EXPECT_FALSE(SegmentsOf(child).empty());
  ShmCommunicator::RemoveStaleSegments();
  EXPECT_TRUE(SegmentsOf(child).empty());
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
}

}  // namespace
}  // namespace ddp
