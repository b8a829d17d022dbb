// Proves the ThreadSanitizer set-up can fail. Main adds to a counter under
// an absl::Mutex, then lets the other thread go through a relaxed atomic
// (which orders nothing for TSan); the other thread adds to it under the
// same mutex (`locked`: no report expected) or without it (`unlocked`: a
// data race must be reported, every run). A Notification and a Condition
// are used too. Without tsan_absl.cc the locked run reports as well; with a
// shim that synchronized too much, the unlocked one would not.
#include <atomic>
#include <cstring>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

int main(int argc, char** argv) {
  const bool unlocked = argc > 1 && std::strcmp(argv[1], "unlocked") == 0;
  absl::Mutex mu;
  long counter = 0;  // behind mu
  long handed = 0;   // written before Notify, read after the wait
  std::atomic<bool> go{false};
  absl::Notification done;
  std::thread other([&] {
    while (!go.load(std::memory_order_relaxed)) std::this_thread::yield();
    if (unlocked) {
      ++counter;
    } else {
      absl::MutexLock lock(&mu);
      ++counter;
    }
    handed = 42;
    done.Notify();
  });
  {
    absl::MutexLock lock(&mu);
    ++counter;
  }
  go.store(true, std::memory_order_relaxed);
  done.WaitForNotification();
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](long* c) { return *c == 2; }, &counter));
  }
  other.join();
  return handed == 42 ? 0 : 1;
}
