#include "worker/collective/shm_names.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>

namespace ddp {
namespace {

constexpr int kSlots = 8;
constexpr size_t kPathBytes = 96;

// Written before `used` is set, read by the handler after it sees it.
struct Slot {
  std::atomic<bool> used{false};
  char path[kPathBytes];
};
Slot slots[kSlots];
std::mutex claim;

void UnlinkPending(int sig) {
  for (Slot& s : slots) {
    if (s.used.load(std::memory_order_acquire)) ::unlink(s.path);  // async-signal-safe
  }
  // Then what the signal would have done.
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void InstallOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int sig : {SIGTERM, SIGINT}) {
      struct sigaction current = {};
      if (::sigaction(sig, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) continue;
      struct sigaction ours = {};
      ours.sa_handler = UnlinkPending;
      sigemptyset(&ours.sa_mask);
      ::sigaction(sig, &ours, nullptr);
    }
  });
}

}  // namespace

PendingShmName::PendingShmName(const std::string& name) {
  // shm_open's "/ddp-..." is /dev/shm/ddp-... on Linux.
  const std::string path = "/dev/shm" + name;
  if (path.size() >= kPathBytes) return;
  InstallOnce();
  std::lock_guard<std::mutex> lock(claim);
  for (int i = 0; i < kSlots; ++i) {
    if (slots[i].used.load(std::memory_order_relaxed)) continue;
    std::memcpy(slots[i].path, path.c_str(), path.size() + 1);
    slots[i].used.store(true, std::memory_order_release);
    slot_ = i;
    return;
  }
}

PendingShmName::~PendingShmName() {
  if (slot_ < 0) return;
  std::lock_guard<std::mutex> lock(claim);
  slots[slot_].used.store(false, std::memory_order_release);
}

}  // namespace ddp
