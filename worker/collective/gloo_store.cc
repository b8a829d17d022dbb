#include "worker/collective/gloo_store.h"

#include <algorithm>

#include "gloo/common/error.h"

namespace ddp {

void CoordinatorGlooStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s = client_->Set(Key(key), std::string(data.begin(), data.end()));
  if (!s.ok()) throw gloo::IoException(std::string(s.message()));
}

std::vector<char> CoordinatorGlooStore::get(const std::string& key) {
  absl::StatusOr<std::string> v = client_->Get(Key(key), timeout_);
  if (!v.ok()) throw gloo::IoException(std::string(v.status().message()));
  return std::vector<char>(v->begin(), v->end());
}

void CoordinatorGlooStore::wait(const std::vector<std::string>& keys) {
  wait(keys, absl::ToChronoMilliseconds(timeout_));
}

void CoordinatorGlooStore::wait(const std::vector<std::string>& keys,
                                const std::chrono::milliseconds& timeout) {
  const absl::Duration limit = std::min(timeout_, absl::FromChrono(timeout));
  for (const auto& key : keys) {
    absl::StatusOr<std::string> v = client_->Get(Key(key), limit);
    if (!v.ok()) throw gloo::IoException(std::string(v.status().message()));
  }
}

}  // namespace ddp
