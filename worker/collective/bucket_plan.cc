#include "worker/collective/bucket_plan.h"

namespace ddp {

namespace {

// Greedy: a bucket closes once it holds at least its cap.
std::vector<std::vector<size_t>> Greedy(const std::vector<size_t>& bytes,
                                        const std::vector<size_t>& order, size_t first_cap,
                                        size_t cap) {
  std::vector<std::vector<size_t>> buckets;
  std::vector<size_t> current;
  size_t filled = 0;
  for (size_t index : order) {
    current.push_back(index);
    filled += bytes[index];
    const size_t limit = buckets.empty() ? first_cap : cap;
    if (filled >= limit) {
      buckets.push_back(std::move(current));
      current.clear();
      filled = 0;
    }
  }
  if (!current.empty()) buckets.push_back(std::move(current));
  return buckets;
}

}  // namespace

std::vector<std::vector<size_t>> PlanBuckets(const std::vector<size_t>& bytes,
                                             const std::vector<size_t>& order, size_t first_cap,
                                             size_t cap, bool split_tail) {
  std::vector<std::vector<size_t>> buckets = Greedy(bytes, order, first_cap, cap);
  if (!split_tail || buckets.size() < 2 || first_cap >= cap) return buckets;
  std::vector<size_t> tail = std::move(buckets.back());
  buckets.pop_back();
  for (std::vector<size_t>& piece : Greedy(bytes, tail, first_cap, first_cap)) {
    buckets.push_back(std::move(piece));
  }
  return buckets;
}

std::vector<size_t> ReverseOrder(size_t n) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = n - 1 - i;
  return order;
}

std::vector<size_t> CompleteReadyOrder(const std::vector<size_t>& observed, size_t n) {
  std::vector<bool> seen(n, false);
  std::vector<size_t> order;
  order.reserve(n);
  for (size_t i : observed) {
    if (i < n && !seen[i]) {
      seen[i] = true;
      order.push_back(i);
    }
  }
  for (size_t i = n; i-- > 0;) {
    if (!seen[i]) order.push_back(i);
  }
  return order;
}

}  // namespace ddp
