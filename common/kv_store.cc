#include "common/kv_store.h"

#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/quote.h"

namespace ddp {

void KvStore::Run(Fired& fired) {
  for (auto& [done, result] : fired) done(std::move(result));
}

absl::Status KvStore::CheckKey(const std::string& key) const {
  if (key.empty()) return absl::InvalidArgumentError("store key is empty");
  if (key.size() > options_.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("store key ", Quote(key), " is ", key.size(),
                                                   " bytes; the store's key limit is ",
                                                   options_.max_key_bytes, " bytes"));
  }
  return absl::OkStatus();
}

void KvStore::FireLocked(WaiterId id, absl::StatusOr<std::string> result, Fired* fired) {
  auto it = waiters_.find(id);
  waiters_by_key_.erase({it->second.full_key, id});
  waiters_by_deadline_.erase({it->second.deadline, id});
  fired->emplace_back(std::move(it->second.done), std::move(result));
  waiters_.erase(it);
}

void KvStore::WakeLocked(const std::string& full_key, const std::string& value, Fired* fired) {
  std::vector<WaiterId> woken;
  for (auto it = waiters_by_key_.lower_bound({full_key, 0});
       it != waiters_by_key_.end() && it->first == full_key; ++it) {
    woken.push_back(it->second);
  }
  for (WaiterId id : woken) FireLocked(id, value, fired);
}

absl::Status KvStore::PutLocked(const std::string& ns, const std::string& key, std::string value,
                                Fired* fired) {
  if (value.size() > options_.max_value_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("store value for key ", Quote(key), " is ", value.size(),
                     " bytes; the store's value limit is ", options_.max_value_bytes, " bytes"));
  }
  std::string full = ns + key;
  auto it = values_.find(full);
  Usage& usage = usage_[ns];
  const size_t old_bytes = it == values_.end() ? 0 : key.size() + it->second.size();
  const size_t new_bytes = usage.bytes - old_bytes + key.size() + value.size();
  if (it == values_.end() && usage.keys >= options_.max_keys_per_namespace) {
    return absl::ResourceExhaustedError(
        absl::StrCat("store namespace ", Quote(ns), " already holds ", usage.keys,
                     " keys, the store's limit per namespace; key ", Quote(key), " was not set"));
  }
  if (new_bytes > options_.max_namespace_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("store namespace ", Quote(ns), " would hold ", new_bytes,
                     " bytes of keys and values; the store's limit per namespace is ",
                     options_.max_namespace_bytes, " bytes; key ", Quote(key), " was not set"));
  }
  if (it == values_.end()) {
    ++usage.keys;
    it = values_.emplace(std::move(full), std::string()).first;
  }
  usage.bytes = new_bytes;
  it->second = std::move(value);
  WakeLocked(it->first, it->second, fired);
  return absl::OkStatus();
}

absl::Status KvStore::Set(const std::string& ns, const std::string& key, std::string value) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  Fired fired;
  absl::Status stored;
  {
    absl::MutexLock lock(&mu_);
    stored = PutLocked(ns, key, std::move(value), &fired);
  }
  Run(fired);
  return stored;
}

absl::StatusOr<int64_t> KvStore::Add(const std::string& ns, const std::string& key, int64_t delta) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  Fired fired;
  int64_t sum = 0;
  {
    absl::MutexLock lock(&mu_);
    int64_t current = 0;
    if (auto it = values_.find(ns + key);
        it != values_.end() && !it->second.empty() && !absl::SimpleAtoi(it->second, &current)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "store key ", Quote(key), " holds a value that is not an integer; add needs one"));
    }
    if (__builtin_add_overflow(current, delta, &sum)) {
      return absl::OutOfRangeError(absl::StrCat("store key ", Quote(key), ": ", current, " + ",
                                                delta, " does not fit in a 64-bit integer (",
                                                std::numeric_limits<int64_t>::min(), " to ",
                                                std::numeric_limits<int64_t>::max(), ")"));
    }
    if (absl::Status s = PutLocked(ns, key, absl::StrCat(sum), &fired); !s.ok()) return s;
  }
  Run(fired);
  return sum;
}

KvStore::WaiterId KvStore::Get(const std::string& ns, const std::string& key, absl::Time deadline,
                               GetCallback done) {
  if (absl::Status s = CheckKey(key); !s.ok()) {
    done(s);
    return 0;
  }
  absl::StatusOr<std::string> answer;
  {
    absl::MutexLock lock(&mu_);
    std::string full = ns + key;
    if (auto it = values_.find(full); it != values_.end()) {
      answer = it->second;
    } else if (waiters_.size() >= options_.max_waiters) {
      answer = absl::ResourceExhaustedError(
          absl::StrCat(waiters_.size(), " store gets are waiting already, the store's limit (",
                       options_.max_waiters, "); get ", Quote(key), " again later"));
    } else {
      const WaiterId id = next_waiter_++;
      waiters_by_key_.emplace(full, id);
      waiters_by_deadline_.emplace(deadline, id);
      waiters_.emplace(id, Waiter{std::move(full), deadline, std::move(done)});
      return id;
    }
  }
  done(std::move(answer));
  return 0;
}

void KvStore::Cancel(WaiterId id) {
  Fired fired;
  {
    absl::MutexLock lock(&mu_);
    if (!waiters_.count(id)) return;
    FireLocked(id, absl::CancelledError("the store get was cancelled by its caller"), &fired);
  }
  Run(fired);
}

void KvStore::ExpireWaiters() {
  const absl::Time now = clock_->Now();
  Fired fired;
  {
    absl::MutexLock lock(&mu_);
    while (!waiters_by_deadline_.empty() && waiters_by_deadline_.begin()->first <= now) {
      const WaiterId id = waiters_by_deadline_.begin()->second;
      FireLocked(id,
                 absl::DeadlineExceededError(
                     absl::StrCat("store key ", Quote(waiters_.at(id).full_key),
                                  " was not set before the deadline; a peer may not have "
                                  "started or may have failed before the rendezvous")),
                 &fired);
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
    for (auto it = usage_.lower_bound(prefix);
         it != usage_.end() && absl::StartsWith(it->first, prefix);) {
      it = usage_.erase(it);
    }
    std::vector<WaiterId> dropped;
    for (auto it = waiters_by_key_.lower_bound({prefix, 0});
         it != waiters_by_key_.end() && absl::StartsWith(it->first, prefix); ++it) {
      dropped.push_back(it->second);
    }
    for (WaiterId id : dropped) FireLocked(id, absl::AbortedError(why), &fired);
  }
  Run(fired);
}

size_t KvStore::num_keys() const {
  absl::MutexLock lock(&mu_);
  return values_.size();
}

size_t KvStore::num_bytes() const {
  absl::MutexLock lock(&mu_);
  size_t bytes = 0;
  // One entry per live generation's namespace: a handful.
  for (const auto& [ns, usage] : usage_) bytes += usage.bytes;
  return bytes;
}

size_t KvStore::num_waiters() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

size_t KvStore::namespace_bytes(const std::string& ns) const {
  absl::MutexLock lock(&mu_);
  auto it = usage_.find(ns);
  return it == usage_.end() ? 0 : it->second.bytes;
}

}  // namespace ddp
