// Which gradients share an all-reduce: pure functions, table-tested.
#ifndef DDP_WORKER_COLLECTIVE_BUCKET_PLAN_H_
#define DDP_WORKER_COLLECTIVE_BUCKET_PLAN_H_

#include <cstddef>
#include <vector>

namespace ddp {

// DDP's defaults: a small first bucket so communication starts early in
// backward, then about 25 MiB each.
inline constexpr size_t kDefaultFirstBucketBytes = size_t{1} << 20;
inline constexpr size_t kDefaultBucketBytes = size_t{25} << 20;

// Groups tensors of `bytes[i]` bytes, taken in `order`, into buckets: a
// bucket closes as soon as it holds at least its cap (so one tensor larger
// than the cap gets a bucket of its own); the first bucket's cap is
// `first_cap`, the others' `cap`. The last bucket is then split again at
// `first_cap`: its all-reduce can only start when backward ends, so its
// tensors go in small pieces as they become ready instead of all at once
// after (ResNet-18 on 1 Gbit/s: an 8.7 MB tail of 78 ms). Returns tensor
// indices per bucket, in `order`. Every index in `order` appears exactly
// once.
// Without `split_tail`, the plan is PyTorch's exactly (what PowerSGD's
// numbers depend on).
std::vector<std::vector<size_t>> PlanBuckets(const std::vector<size_t>& bytes,
                                             const std::vector<size_t>& order, size_t first_cap,
                                             size_t cap, bool split_tail = true);

// The order to plan buckets in before any step ran: gradients become ready
// roughly from the last layer back, so reverse registration order.
std::vector<size_t> ReverseOrder(size_t n);

// `observed` (the order in which gradients became ready in one step), then
// the tensors that never became ready, in reverse registration order.
std::vector<size_t> CompleteReadyOrder(const std::vector<size_t>& observed, size_t n);

}  // namespace ddp

#endif  // DDP_WORKER_COLLECTIVE_BUCKET_PLAN_H_
