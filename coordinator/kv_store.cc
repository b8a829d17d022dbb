#include "coordinator/kv_store.h"

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ddp {

void KvStore::Run(Fired& fired) {
  for (auto& [done, result] : fired) done(std::move(result));
}

void KvStore::WakeLocked(const std::string& full_key, const std::string& value, Fired* fired) {
  auto [begin, end] = waiters_.equal_range(full_key);
  for (auto it = begin; it != end; ++it) fired->emplace_back(std::move(it->second.done), value);
  waiters_.erase(begin, end);
}

void KvStore::Set(const std::string& ns, const std::string& key, std::string value) {
  Fired fired;
  {
    absl::MutexLock lock(&mu_);
    std::string full = ns + key;
    WakeLocked(full, value, &fired);
    values_[std::move(full)] = std::move(value);
  }
  Run(fired);
}

absl::StatusOr<int64_t> KvStore::Add(const std::string& ns, const std::string& key, int64_t delta) {
  Fired fired;
  int64_t sum = 0;
  {
    absl::MutexLock lock(&mu_);
    const std::string full = ns + key;
    std::string& value = values_[full];
    int64_t current = 0;
    if (!value.empty() && !absl::SimpleAtoi(value, &current)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "store key \"", key, "\" holds a value that is not an integer; add needs one"));
    }
    sum = current + delta;
    value = absl::StrCat(sum);
    WakeLocked(full, value, &fired);
  }
  Run(fired);
  return sum;
}

void KvStore::Get(const std::string& ns, const std::string& key, absl::Time deadline,
                  GetCallback done) {
  std::string found;
  {
    absl::MutexLock lock(&mu_);
    std::string full = ns + key;
    auto it = values_.find(full);
    if (it == values_.end()) {
      waiters_.emplace(std::move(full), Waiter{deadline, std::move(done)});
      return;
    }
    found = it->second;
  }
  done(std::move(found));
}

void KvStore::ExpireWaiters() {
  const absl::Time now = clock_->Now();
  Fired fired;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->second.deadline > now) {
        ++it;
        continue;
      }
      fired.emplace_back(std::move(it->second.done),
                         absl::DeadlineExceededError(
                             absl::StrCat("store key \"", it->first,
                                          "\" was not set before the deadline; a peer may not have "
                                          "started or may have failed before the rendezvous")));
      it = waiters_.erase(it);
    }
  }
  Run(fired);
}

void KvStore::DropNamespaces(const std::string& prefix, const std::string& why) {
  Fired fired;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = values_.lower_bound(prefix);
         it != values_.end() && absl::StartsWith(it->first, prefix);) {
      it = values_.erase(it);
    }
    for (auto it = waiters_.lower_bound(prefix);
         it != waiters_.end() && absl::StartsWith(it->first, prefix);) {
      fired.emplace_back(std::move(it->second.done), absl::AbortedError(why));
      it = waiters_.erase(it);
    }
  }
  Run(fired);
}

size_t KvStore::num_keys() const {
  absl::MutexLock lock(&mu_);
  return values_.size();
}

size_t KvStore::num_waiters() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

}  // namespace ddp
