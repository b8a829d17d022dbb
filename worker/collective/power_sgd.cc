#include "worker/collective/power_sgd.h"

#include <algorithm>
#include <utility>

#include <ATen/ATen.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace ddp {
using Compressed = PowerSgd::Compressed;

absl::Status CheckPowerSgdOptions(const PowerSgdOptions& options) {
  if (options.rank >= 1 && options.start_iter >= 2) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("PowerSGD needs a rank of at least 1 and a start step of at least 2, as "
                   "PyTorch's start_powerSGD_iter (got rank ",
                   options.rank, ", start step ", options.start_iter, ")"));
}

uint32_t LegacyNumpySeeds::Next() {
  // randint(1e9) in numpy's legacy generator: 32-bit draws masked to the
  // smallest 2^k - 1 covering the range, redrawn while out of it (7% of
  // draws; 1e3 redraws in a row has odds below 1e-1000).
  constexpr uint32_t kLargest = 999'999'999;
  constexpr uint32_t kMask = (1u << 30) - 1;
  uint32_t value = 0;
  for (int draws = 0; draws < 1000; ++draws) {
    value = static_cast<uint32_t>(mt_()) & kMask;
    if (value <= kLargest) break;
  }
  return value;
}

void OrthogonalizeColumns(at::Tensor& matrices) {
  const int64_t columns = matrices.size(2);
  if (columns > 2) {
    at::Tensor r = at::empty({matrices.size(0), columns, columns}, matrices.options());
    at::linalg_qr_outf(matrices, "reduced", matrices, r);
    return;
  }
  for (int64_t i = 0; i < columns; ++i) {
    at::Tensor column = matrices.narrow(2, i, 1);
    // torch.norm(col, dim=1, keepdim=True) is the Frobenius norm; a zero
    // column gives NaN, as in PyTorch's hook without epsilon.
    column.div_(at::frobenius_norm(column, {1}, /*keepdim=*/true));
    if (i + 1 < columns) {
      at::Tensor rest = matrices.narrow(2, i + 1, columns - i - 1);
      rest.sub_(at::sum(column * rest, {1}, /*keepdim=*/true) * column);
    }
  }
}

namespace {

// Which gradients of the bucket are worth compressing (returned, grouped by
// shape in the order each shape first appears: the hook's dict order,
// which decides what random values each Q gets) and which are not
// (`plain`).
std::vector<Compressed> ChooseCompressed(const at::Tensor& grads,
                                         const std::vector<std::vector<int64_t>>& shapes,
                                         const PowerSgdOptions& options,
                                         std::vector<at::Tensor>* plain) {
  std::vector<std::pair<std::pair<int64_t, int64_t>, std::vector<Compressed>>> groups;
  int64_t offset = 0;
  for (const std::vector<int64_t>& shape : shapes) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    at::Tensor grad = grads.narrow(0, offset, numel);
    offset += numel;
    const int64_t n = shape.empty() ? 1 : shape[0];
    const int64_t m = n > 0 ? numel / n : 0;
    const int64_t rank = std::min({n, m, static_cast<int64_t>(options.rank)});
    const bool worth = static_cast<double>((n + m) * rank) * options.min_compression_rate <
                       static_cast<double>(n * m);
    if (!worth) {
      plain->push_back(grad);
      continue;
    }
    auto group = std::find_if(groups.begin(), groups.end(),
                              [&](const auto& g) { return g.first == std::make_pair(n, m); });
    if (group == groups.end()) {
      groups.push_back({{n, m}, {}});
      group = std::prev(groups.end());
    }
    group->second.push_back(Compressed{grad.view({1, n, m}), rank});
  }
  std::vector<Compressed> compressed;
  for (auto& group : groups) {
    for (Compressed& c : group.second) compressed.push_back(std::move(c));
  }
  return compressed;
}

// The uncompressed gradients as they are: summed, then divided (after the
// sum, as the hook). Returns how many values went over the wire.
absl::StatusOr<int64_t> ReducePlain(std::vector<at::Tensor>& plain,
                                    const at::TensorOptions& options, Communicator& comm,
                                    float world) {
  at::Tensor rest = plain.empty() ? at::empty({0}, options) : at::cat(plain);
  if (absl::Status s = comm.AllReduceSum(rest.data_ptr<float>(), static_cast<size_t>(rest.numel()));
      !s.ok()) {
    return s;
  }
  rest.div_(world);
  int64_t at = 0;
  for (at::Tensor& grad : plain) {
    grad.copy_(rest.narrow(0, at, grad.numel()));
    at += grad.numel();
  }
  return rest.numel();
}

}  // namespace

void PowerSgd::PlaceFactors(BucketState& state, const std::vector<Compressed>& compressed,
                            const at::TensorOptions& options, std::vector<at::Tensor>* ps,
                            std::vector<at::Tensor>* qs) {
  // P and Q live on from step to step (warm start); new ones start from
  // random values every rank draws alike.
  const bool fresh = !state.p.defined();
  if (fresh) {
    int64_t p_size = 0;
    int64_t q_size = 0;
    for (const Compressed& c : compressed) {
      p_size += c.matrix.size(1) * c.rank;
      q_size += c.matrix.size(2) * c.rank;
    }
    state.p = at::empty({p_size}, options);
    state.q = at::empty({q_size}, options);
  }
  int64_t p_at = 0;
  int64_t q_at = 0;
  for (const Compressed& c : compressed) {
    const int64_t n = c.matrix.size(1);
    const int64_t m = c.matrix.size(2);
    ps->push_back(state.p.narrow(0, p_at, n * c.rank).view({1, n, c.rank}));
    qs->push_back(state.q.narrow(0, q_at, m * c.rank).view({1, m, c.rank}));
    p_at += n * c.rank;
    q_at += m * c.rank;
  }
  if (fresh) {
    at::Generator generator = at::detail::createCPUGenerator(seeds_.Next());
    for (at::Tensor& q : *qs) {
      q.copy_(at::randn(q.sizes(), generator, q.options()));
      OrthogonalizeColumns(q);
    }
  } else {
    for (at::Tensor& q : *qs) OrthogonalizeColumns(q);
  }
}

absl::Status PowerSgd::Reduce(size_t index, const at::Tensor& grads,
                              const std::vector<std::vector<int64_t>>& shapes, Communicator& comm,
                              float world, uint64_t* wire) {
  BucketState& state = buckets_[index];
  if (state.error.defined()) {
    grads.add_(state.error);
  } else {
    state.error = at::zeros_like(grads);
  }
  // The error buffer holds the bucket before compression until the end,
  // where what the bucket holds after is subtracted: the hook's
  // input_cp - input, without two bucket-sized allocations a step.
  state.error.copy_(grads);
  std::vector<at::Tensor> plain;
  std::vector<Compressed> compressed = ChooseCompressed(grads, shapes, options_, &plain);
  std::vector<at::Tensor> ps;
  std::vector<at::Tensor> qs;
  PlaceFactors(state, compressed, grads.options(), &ps, &qs);
  for (size_t i = 0; i < compressed.size(); ++i) at::bmm_out(ps[i], compressed[i].matrix, qs[i]);
  absl::StatusOr<int64_t> plain_values = ReducePlain(plain, grads.options(), comm, world);
  if (!plain_values.ok()) return plain_values.status();

  // P summed (orthogonalized next, so not divided); Q = M^T P, averaged.
  absl::Status s =
      comm.AllReduceSum(state.p.data_ptr<float>(), static_cast<size_t>(state.p.numel()));
  if (!s.ok()) return s;
  for (at::Tensor& p : ps) OrthogonalizeColumns(p);
  for (size_t i = 0; i < compressed.size(); ++i) {
    at::bmm_out(qs[i], compressed[i].matrix.transpose(1, 2), ps[i]);
  }
  s = comm.AllReduceSum(state.q.data_ptr<float>(), static_cast<size_t>(state.q.numel()));
  if (!s.ok()) return s;
  state.q.div_(world);
  for (size_t i = 0; i < compressed.size(); ++i) {
    at::bmm_out(compressed[i].matrix, ps[i], qs[i].transpose(1, 2));
  }
  state.error.sub_(grads);
  *wire = (*plain_values + state.p.numel() + state.q.numel()) * sizeof(float);
  return absl::OkStatus();
}

}  // namespace ddp
