#include "worker/collective/shm_communicator.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <new>
#include <optional>
#include <random>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gloo/rendezvous/store.h"
#include "worker/collective/shm_names.h"

namespace ddp {
namespace {

constexpr uint64_t kMagic = 0x6464702d73686d31;  // "ddp-shm1"
// Spins before sleeping on the futex: peers usually arrive within
// microseconds of each other.
constexpr int kSpins = 2000;
constexpr absl::Duration kLivenessEvery = absl::Milliseconds(100);

struct alignas(64) Word {
  std::atomic<uint32_t> value;
};

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

void Wake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Sleeps while *word == seen, at most `timeout`.
void Sleep(std::atomic<uint32_t>* word, uint32_t seen, absl::Duration timeout) {
  const timespec ts = absl::ToTimespec(timeout);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

bool Reached(uint32_t value, uint32_t sequence) {
  return static_cast<int32_t>(value - sequence) >= 0;
}

absl::Status Errno(const std::string& what) {
  return absl::FailedPreconditionError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Gloo's store contract: wait for a key, then get it.
std::string Get(gloo::rendezvous::Store& store, const std::string& key, absl::Duration timeout) {
  store.wait({key}, absl::ToChronoMilliseconds(timeout));
  std::vector<char> v = store.get(key);
  return std::string(v.begin(), v.end());
}

void Set(gloo::rendezvous::Store& store, const std::string& key, const std::string& value) {
  store.set(key, std::vector<char>(value.begin(), value.end()));
}

}  // namespace

struct ShmCommunicator::Segment {
  uint64_t magic;
  uint32_t world;
  uint64_t slot_bytes;
  // Set by a rank that aborts: every wait fails at once.
  alignas(64) std::atomic<uint32_t> aborted;
  alignas(64) std::atomic<int32_t> pids[kMaxRanks];
  // [0]: arrived at an operation; [1]: done reading the slots. Each holds
  // the sequence number of the rank's latest operation.
  Word counters[2][kMaxRanks];
};

namespace {

// Whether process `pid` is gone: no such process, or a zombie (killed, not
// yet reaped by its parent: it will never unlink anything).
bool Gone(int pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  char path[32];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;
  // "pid (comm) S ...": the state follows the last ')'.
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* close = std::strrchr(buf, ')');
  return close != nullptr && close[1] == ' ' && close[2] == 'Z';
}

}  // namespace

void ShmCommunicator::RemoveStaleSegments() {
  // Our segments are named /ddp-<creator pid>-<random>; one whose creator
  // is gone was left by a rank 0 killed between creating and unlinking it.
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;
  while (const dirent* entry = ::readdir(dir)) {
    int pid = 0;
    char rest[64];
    if (std::sscanf(entry->d_name, "ddp-%d-%63s", &pid, rest) != 2 || pid <= 0) continue;
    if (!Gone(pid)) continue;
    ::shm_unlink(absl::StrCat("/", entry->d_name).c_str());
  }
  ::closedir(dir);
}

size_t ShmCommunicator::DataOffset() { return (sizeof(Segment) + 63) / 64 * 64; }

absl::Status ShmCommunicator::CreateSegment(const std::string& name, size_t bytes,
                                            const Options& options, Segment** segment) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("shm_open " + name);
  absl::Status status;
  // Reserve the pages now: touching a page tmpfs can't back is SIGBUS.
  if (const int e = ::posix_fallocate(fd, 0, bytes); e != 0) {
    errno = e;
    status = Errno(absl::StrCat("reserving ", bytes >> 20, " MiB in /dev/shm"));
  } else {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      status = Errno("mmap");
    } else {
      std::memset(p, 0, DataOffset());
      *segment = new (p) Segment;
      (*segment)->world = options.world_size;
      (*segment)->slot_bytes = options.slot_bytes;
      std::atomic_thread_fence(std::memory_order_release);
      (*segment)->magic = kMagic;
    }
  }
  ::close(fd);
  if (!status.ok()) ::shm_unlink(name.c_str());
  return status;
}

absl::Status ShmCommunicator::MapSegment(const std::string& name, size_t bytes,
                                         const Options& options, Segment** segment) {
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("shm_open " + name);
  absl::Status status;
  struct stat st = {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    status = absl::FailedPreconditionError(name + " has the wrong size");
  } else if (void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
             p == MAP_FAILED) {
    status = Errno("mmap");
  } else {
    *segment = static_cast<Segment*>(p);
    if ((*segment)->magic != kMagic ||
        (*segment)->world != static_cast<uint32_t>(options.world_size)) {
      status = absl::FailedPreconditionError(name + " is not this generation's segment");
    }
  }
  ::close(fd);
  return status;
}

absl::StatusOr<std::unique_ptr<ShmCommunicator>> ShmCommunicator::Create(
    gloo::rendezvous::Store& store, const Options& options) {
  if (options.world_size > kMaxRanks) {
    return absl::FailedPreconditionError(absl::StrCat("shared-memory collectives take at most ",
                                                      kMaxRanks, " ranks on one machine"));
  }
  const size_t bytes = DataOffset() + (options.world_size + 1) * options.slot_bytes;
  Segment* segment = nullptr;
  std::string created;                    // rank 0: the name, until it is unlinked
  std::optional<PendingShmName> pending;  // the same, for SIGTERM and SIGINT
  absl::Status status;
  try {
    if (options.rank == 0) {
      RemoveStaleSegments();
      std::random_device random;
      const std::string name = absl::StrFormat("/ddp-%d-%08x%08x", ::getpid(), random(), random());
      pending.emplace(name);
      status = CreateSegment(name, bytes, options, &segment);
      if (status.ok()) created = name;
      Set(store, "shm/segment", status.ok() ? name : "error:" + std::string(status.message()));
      if (status.ok()) {
        // Rank 0 names the segment until everyone mapped it (see below).
        Set(store, "shm/name", name);
      }
    } else {
      const std::string name = Get(store, "shm/segment", options.timeout);
      if (absl::StartsWith(name, "error:")) {
        status = absl::FailedPreconditionError(absl::StrCat("rank 0: ", name.substr(6)));
      } else {
        status = MapSegment(name, bytes, options, &segment);
      }
    }
    // Everyone learns whether everyone mapped it, so all ranks fall back
    // together or none does.
    if (status.ok()) segment->pids[options.rank] = ::getpid();
    Set(store, absl::StrCat("shm/mapped/", options.rank),
        status.ok() ? "ok" : std::string(status.message()));
    for (int r = 0; r < options.world_size; ++r) {
      const std::string peer = Get(store, absl::StrCat("shm/mapped/", r), options.timeout);
      if (peer != "ok" && status.ok()) {
        status = absl::FailedPreconditionError(absl::StrCat("rank ", r, ": ", peer));
      }
    }
    if (options.rank == 0 && segment != nullptr) {
      // Mapped by all (or given up): the name can go; the memory lives until
      // the last rank unmaps it, and nothing is left behind if ranks die.
      ::shm_unlink(created.c_str());
      created.clear();
      pending.reset();
    }
  } catch (const std::exception& e) {
    status = absl::UnavailableError(absl::StrCat("shared-memory rendezvous failed: ", e.what()));
  }
  // A rendezvous that did not complete (a peer died, the store went away)
  // must not leave the segment behind.
  if (!created.empty()) ::shm_unlink(created.c_str());
  if (!status.ok()) {
    if (segment != nullptr) ::munmap(segment, bytes);
    return status;
  }
  return std::unique_ptr<ShmCommunicator>(new ShmCommunicator(segment, bytes, options));
}

ShmCommunicator::ShmCommunicator(Segment* segment, size_t mapped_bytes, const Options& options)
    : segment_(segment), mapped_bytes_(mapped_bytes), options_(options) {}

ShmCommunicator::~ShmCommunicator() { ::munmap(segment_, mapped_bytes_); }

char* ShmCommunicator::slot(int rank) const {
  return reinterpret_cast<char*>(segment_) + DataOffset() + rank * options_.slot_bytes;
}

char* ShmCommunicator::result() const { return slot(options_.world_size); }

absl::Status ShmCommunicator::WaitFor(int phase, int peer, uint32_t sequence, absl::Time deadline) {
  std::atomic<uint32_t>* word = &segment_->counters[phase][peer].value;
  for (int i = 0; i < kSpins; ++i) {
    if (Reached(word->load(std::memory_order_acquire), sequence)) return absl::OkStatus();
    CpuRelax();
  }
  absl::Time next_liveness = absl::Now() + kLivenessEvery;
  while (true) {
    const uint32_t seen = word->load(std::memory_order_acquire);
    if (Reached(seen, sequence)) return absl::OkStatus();
    if (aborted_) return absl::AbortedError("shared-memory collective aborted");
    if (segment_->aborted.load(std::memory_order_acquire)) {
      return absl::UnavailableError("a peer aborted the shared-memory collective");
    }
    const absl::Time now = absl::Now();
    if (now > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "shared-memory collective on rank ", options_.rank, ": rank ", peer,
          " did not arrive within ", absl::FormatDuration(options_.timeout), " (stuck?)"));
    }
    if (now > next_liveness) {
      const pid_t pid = segment_->pids[peer].load();
      if (::kill(pid, 0) != 0 && errno == ESRCH) {
        return absl::UnavailableError(
            absl::StrCat("rank ", peer, " (pid ", pid, ") exited during a collective"));
      }
      next_liveness = now + kLivenessEvery;
    }
    Sleep(word, seen, absl::Milliseconds(10));
  }
}

absl::Status ShmCommunicator::Barrier(int phase) {
  std::atomic<uint32_t>* mine = &segment_->counters[phase][options_.rank].value;
  mine->store(sequence_, std::memory_order_release);
  Wake(mine);
  const absl::Time deadline = absl::Now() + options_.timeout;
  for (int r = 0; r < options_.world_size; ++r) {
    if (r == options_.rank) continue;
    if (absl::Status s = WaitFor(phase, r, sequence_, deadline); !s.ok()) return s;
  }
  return absl::OkStatus();
}

template <typename T, typename Add>
absl::Status ShmCommunicator::AllReduceWith(T* data, size_t count, Add add) {
  if (aborted_) return absl::AbortedError("communicator aborted");
  const int n = options_.world_size;
  if (n == 1 || count == 0) return absl::OkStatus();
  const size_t piece = options_.slot_bytes / sizeof(T);
  for (size_t offset = 0; offset < count; offset += piece) {
    const size_t len = std::min(piece, count - offset);
    ++sequence_;
    std::memcpy(slot(options_.rank), data + offset, len * sizeof(T));
    if (absl::Status s = Barrier(0); !s.ok()) return s;
    // This rank sums chunk `rank` over every slot, in rank order.
    const size_t begin = len / n * options_.rank + std::min<size_t>(options_.rank, len % n);
    const size_t end = begin + len / n + (static_cast<size_t>(options_.rank) < len % n ? 1 : 0);
    T* out = reinterpret_cast<T*>(result()) + begin;
    const T* first = reinterpret_cast<const T*>(slot(0)) + begin;
    std::memcpy(out, first, (end - begin) * sizeof(T));
    for (int r = 1; r < n; ++r) {
      const T* in = reinterpret_cast<const T*>(slot(r)) + begin;
      add(out, in, end - begin);
    }
    if (absl::Status s = Barrier(1); !s.ok()) return s;
    std::memcpy(data + offset, result(), len * sizeof(T));
  }
  return CheckNotAborted();
}

absl::Status ShmCommunicator::AllReduceSum(float* data, size_t count) {
  return AllReduceWith(data, count, AddFloats);
}

absl::Status ShmCommunicator::AllReduceSumHalf(uint16_t* data, size_t count, HalfType type) {
  return AllReduceWith(data, count, [type](uint16_t* dst, const uint16_t* src, size_t n) {
    AddHalves(dst, src, n, type);
  });
}

absl::Status ShmCommunicator::CheckNotAborted() const {
  // Peers that gave up after adding their part (a rank stopped mid-way, and
  // the coordinator aborted the others) leave everything this rank needs to
  // finish: the collective completes here but not there, and must not count.
  if (segment_->aborted.load(std::memory_order_acquire) != 0) {
    return absl::AbortedError("a peer aborted the shared-memory collective");
  }
  return absl::OkStatus();
}

absl::Status ShmCommunicator::Broadcast(void* data, size_t bytes, int root) {
  if (aborted_) return absl::AbortedError("communicator aborted");
  if (options_.world_size == 1 || bytes == 0) return absl::OkStatus();
  char* bytes_ptr = static_cast<char*>(data);
  for (size_t offset = 0; offset < bytes; offset += options_.slot_bytes) {
    const size_t len = std::min(options_.slot_bytes, bytes - offset);
    ++sequence_;
    if (options_.rank == root) std::memcpy(slot(root), bytes_ptr + offset, len);
    if (absl::Status s = Barrier(0); !s.ok()) return s;
    if (options_.rank != root) std::memcpy(bytes_ptr + offset, slot(root), len);
    if (absl::Status s = Barrier(1); !s.ok()) return s;
  }
  return CheckNotAborted();
}

void ShmCommunicator::Abort() {
  if (aborted_.exchange(true)) return;
  segment_->aborted.store(1, std::memory_order_release);
  for (int phase = 0; phase < 2; ++phase) {
    for (int r = 0; r < options_.world_size; ++r) Wake(&segment_->counters[phase][r].value);
  }
}

}  // namespace ddp
