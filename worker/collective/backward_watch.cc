// The RecordFunction callback that tells a Reducer its backward has begun
// (Reducer::WatchForBackward): how a DistributedDataParallel arms its hooks
// without a call from the program between forward and backward.
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/record_function.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker/collective/reducer.h"

namespace ddp {

// Reducers waiting for the next backward on their training thread, and the
// RecordFunction callback that arms them. It is registered only while one
// waits, for backward nodes only (forward ops never see it), and the first
// node that finds its reducers removes it, so the rest of backward costs
// nothing. Global rather than thread-local: the autograd engine restores a
// backward's thread-local state around each node, which would undo a
// removal made inside one.
struct BackwardWatch {
  static BackwardWatch& Get() {
    static BackwardWatch* watch = new BackwardWatch;
    return *watch;
  }

  void Add(Reducer* reducer) {
    absl::MutexLock lock(&mu_);
    RemoveLocked(reducer);
    waiting_.emplace_back(std::this_thread::get_id(), reducer);
    if (!handle_) {
      handle_ = at::addGlobalCallback(
          at::RecordFunctionCallback(&OnBackwardNode).scopes({at::RecordScope::BACKWARD_FUNCTION}));
    }
  }

  void Remove(Reducer* reducer) {
    absl::MutexLock lock(&mu_);
    RemoveLocked(reducer);
  }

 private:
  static std::unique_ptr<at::ObserverContext> OnBackwardNode(const at::RecordFunction&) {
    BackwardWatch& watch = Get();
    std::vector<Reducer*> mine;
    {
      absl::MutexLock lock(&watch.mu_);
      const std::thread::id here = std::this_thread::get_id();
      for (auto it = watch.waiting_.begin(); it != watch.waiting_.end();) {
        if (it->first == here) {
          mine.push_back(it->second);
          it = watch.waiting_.erase(it);
        } else {
          ++it;
        }
      }
      watch.DropCallbackIfIdleLocked();
    }
    // Outside the lock: arming may run a collective (the buckets' rebuild).
    for (Reducer* reducer : mine) {
      if (!reducer->armed_) reducer->ArmImplicit();
    }
    return nullptr;
  }

  void RemoveLocked(Reducer* reducer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      it = it->second == reducer ? waiting_.erase(it) : it + 1;
    }
    DropCallbackIfIdleLocked();
  }

  void DropCallbackIfIdleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (waiting_.empty() && handle_) {
      at::removeCallback(*handle_);
      handle_.reset();
    }
  }

  absl::Mutex mu_;
  std::optional<at::CallbackHandle> handle_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::thread::id, Reducer*>> waiting_ ABSL_GUARDED_BY(mu_);
};

void Reducer::WatchForBackward() { BackwardWatch::Get().Add(this); }
void Reducer::UnwatchBackward() { BackwardWatch::Get().Remove(this); }

}  // namespace ddp
