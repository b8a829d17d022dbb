#include "coordinator/worker_pages.h"

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"

namespace ddp {
namespace {

using Key = std::tuple<std::string, std::string, std::string>;

Key KeyOf(const v1::WorkerStatus& w) { return {w.host(), w.device(), w.worker_id()}; }

// The fields can hold any byte but NUL (a host, a device, an id are text).
constexpr char kSeparator = '\0';

std::string Token(const Key& key) {
  const std::string joined =
      std::get<0>(key) + kSeparator + std::get<1>(key) + kSeparator + std::get<2>(key);
  return absl::WebSafeBase64Escape(joined);
}

absl::StatusOr<Key> FromToken(const std::string& token) {
  std::string joined;
  std::vector<std::string> parts;
  if (absl::WebSafeBase64Unescape(token, &joined)) {
    parts = absl::StrSplit(joined, kSeparator);
  }
  if (parts.size() != 3) {
    return absl::InvalidArgumentError(
        "page_token is not one this coordinator gave: pass the last page's next_page_token, or "
        "leave it empty for the first page");
  }
  return Key{parts[0], parts[1], parts[2]};
}

}  // namespace

absl::StatusOr<v1::ListWorkersResponse> PageOfWorkers(const v1::JobStatus& status,
                                                      const v1::ListWorkersRequest& request) {
  std::optional<Key> after;
  if (!request.page_token().empty()) {
    absl::StatusOr<Key> key = FromToken(request.page_token());
    if (!key.ok()) return key.status();
    after = *key;
  }
  std::vector<const v1::WorkerStatus*> matching;
  for (const v1::WorkerStatus& w : status.workers()) {
    if (request.state() != v1::WORKER_STATE_UNSPECIFIED && w.state() != request.state()) continue;
    if (request.members_only() && w.rank() < 0) continue;
    matching.push_back(&w);
  }
  std::sort(
      matching.begin(), matching.end(),
      [](const v1::WorkerStatus* a, const v1::WorkerStatus* b) { return KeyOf(*a) < KeyOf(*b); });
  const uint32_t size =
      request.page_size() == 0 ? kDefaultWorkerPage : std::min(request.page_size(), kMaxWorkerPage);
  v1::ListWorkersResponse response;
  response.set_total_size(static_cast<uint32_t>(matching.size()));
  auto first = matching.begin();
  if (after) {
    first =
        std::upper_bound(matching.begin(), matching.end(), *after,
                         [](const Key& key, const v1::WorkerStatus* w) { return key < KeyOf(*w); });
  }
  for (auto it = first; it != matching.end(); ++it) {
    if (static_cast<uint32_t>(response.workers_size()) == size) {
      // More follow: the token names the last one handed out.
      response.set_next_page_token(Token(KeyOf(**(it - 1))));
      break;
    }
    *response.add_workers() = **it;
  }
  return response;
}

}  // namespace ddp
