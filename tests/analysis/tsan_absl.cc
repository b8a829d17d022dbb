// ThreadSanitizer sees no synchronization inside Debian's libabsl: it is not
// built with -fsanitize=thread, and absl::Mutex waits on futexes TSan does
// not intercept. Without help, every field behind an absl::Mutex would look
// racy. Linked only into the TSan build, this file interposes the public
// Mutex, CondVar and Notification functions (the executable's definitions
// win over the library's, also for the library's own calls) and tells TSan
// what each one means: acquiring a mutex is an acquire of its address,
// releasing it a release. Conditions are evaluated under the lock, by
// whichever thread absl picks, so each evaluation is bracketed the same way.
// The real functions are found with dlsym(RTLD_NEXT).
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace {

template <typename Fn>
Fn Real(const char* mangled) {
  void* fn = dlsym(RTLD_NEXT, mangled);
  if (fn == nullptr) {
    std::fprintf(stderr, "tsan_absl: %s not found in libabsl\n", mangled);
    std::abort();
  }
  return reinterpret_cast<Fn>(fn);
}

#define DDP_REAL(type, mangled) static const auto real = Real<type>(mangled)

struct Bracketed {
  const absl::Condition* cond;
  void* mu;
};

bool EvalBracketed(Bracketed* b) {
  __tsan_acquire(b->mu);
  const bool result = b->cond->Eval();
  __tsan_release(b->mu);
  return result;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  DDP_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv");
  real(this);
  __tsan_acquire(this);
}

void Mutex::ReaderLock() {
  DDP_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv");
  real(this);
  __tsan_acquire(this);
}

bool Mutex::TryLock() {
  DDP_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

bool Mutex::ReaderTryLock() {
  DDP_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

void Mutex::Unlock() {
  DDP_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv");
  __tsan_release(this);
  real(this);
}

void Mutex::ReaderUnlock() {
  DDP_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  __tsan_release(this);
  real(this);
}

void Mutex::Await(const Condition& cond) {
  DDP_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  Bracketed b{&cond, this};
  __tsan_release(this);
  real(this, Condition(&EvalBracketed, &b));
  __tsan_acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  DDP_REAL(bool (*)(Mutex*, const Condition&, Duration),
           "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Bracketed b{&cond, this};
  __tsan_release(this);
  const bool result = real(this, Condition(&EvalBracketed, &b), timeout);
  __tsan_acquire(this);
  return result;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  DDP_REAL(bool (*)(Mutex*, const Condition&, Time),
           "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Bracketed b{&cond, this};
  __tsan_release(this);
  const bool result = real(this, Condition(&EvalBracketed, &b), deadline);
  __tsan_acquire(this);
  return result;
}

void Mutex::LockWhen(const Condition& cond) {
  DDP_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  Bracketed b{&cond, this};
  real(this, Condition(&EvalBracketed, &b));
  __tsan_acquire(this);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  DDP_REAL(void (*)(Mutex*, const Condition&),
           "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Bracketed b{&cond, this};
  real(this, Condition(&EvalBracketed, &b));
  __tsan_acquire(this);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  DDP_REAL(bool (*)(Mutex*, const Condition&, Duration),
           "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Bracketed b{&cond, this};
  const bool result = real(this, Condition(&EvalBracketed, &b), timeout);
  __tsan_acquire(this);
  return result;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  DDP_REAL(bool (*)(Mutex*, const Condition&, Time),
           "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Bracketed b{&cond, this};
  const bool result = real(this, Condition(&EvalBracketed, &b), deadline);
  __tsan_acquire(this);
  return result;
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  DDP_REAL(bool (*)(CondVar*, Mutex*, Duration),
           "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  __tsan_release(mu);
  const bool result = real(this, mu, timeout);
  __tsan_acquire(mu);
  return result;
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  DDP_REAL(bool (*)(CondVar*, Mutex*, Time),
           "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  __tsan_release(mu);
  const bool result = real(this, mu, deadline);
  __tsan_acquire(mu);
  return result;
}

void CondVar::Wait(Mutex* mu) {
  DDP_REAL(void (*)(CondVar*, Mutex*), "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  __tsan_release(mu);
  real(this, mu);
  __tsan_acquire(mu);
}

void Notification::Notify() {
  DDP_REAL(void (*)(Notification*), "_ZN4absl7debian312Notification6NotifyEv");
  __tsan_release(this);
  real(this);
}

void Notification::WaitForNotification() const {
  DDP_REAL(void (*)(const Notification*), "_ZNK4absl7debian312Notification19WaitForNotificationEv");
  real(this);
  __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  DDP_REAL(bool (*)(const Notification*, Duration),
           "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool result = real(this, timeout);
  __tsan_acquire(const_cast<Notification*>(this));
  return result;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  DDP_REAL(bool (*)(const Notification*, Time),
           "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool result = real(this, deadline);
  __tsan_acquire(const_cast<Notification*>(this));
  return result;
}

ABSL_NAMESPACE_END
}  // namespace absl
