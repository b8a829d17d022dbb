// Proves the ThreadSanitizer set-up can fail: two threads add to a counter
// behind an absl::Mutex (`locked`: no report expected; also through a
// Condition and a Notification), or one of them skips the lock
// (`unlocked`: a data race must be reported). Without tsan_absl.cc every
// mode reports; with a shim that synchronized too much, none would.
#include <cstring>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

int main(int argc, char** argv) {
  const bool unlocked = argc > 1 && std::strcmp(argv[1], "unlocked") == 0;
  absl::Mutex mu;
  long counter = 0;  // behind mu
  long handed = 0;   // written before Notify, read after the wait
  absl::Notification ready;
  std::thread other([&] {
    for (int i = 0; i < 1000; ++i) {
      if (unlocked) {
        ++counter;
      } else {
        absl::MutexLock lock(&mu);
        ++counter;
      }
    }
    handed = 42;
    ready.Notify();
  });
  for (int i = 0; i < 1000; ++i) {
    absl::MutexLock lock(&mu);
    ++counter;
  }
  ready.WaitForNotification();
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](long* c) { return *c == 2000; }, &counter));
  }
  other.join();
  return handed == 42 ? 0 : 1;
}
