#include "coordinator/throughput_model.h"

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

namespace ddp {
namespace {

double Shape(double n, double a) { return n / (1 + a * (n - 1)); }

// The measurements the model is fitted to (a world of 0 says nothing).
std::vector<std::pair<double, double>> Points(const std::map<uint32_t, double>& measured) {
  std::vector<std::pair<double, double>> points;
  for (const auto& [n, t] : measured) {
    if (n > 0) points.emplace_back(n, t);
  }
  return points;
}

// For a given `a`, the least-squares t1 has a closed form; returns it with
// the squared error it leaves.
std::pair<double, double> FitT1(const std::vector<std::pair<double, double>>& points, double a) {
  double tg = 0, gg = 0;
  for (const auto& [n, t] : points) {
    tg += t * Shape(n, a);
    gg += Shape(n, a) * Shape(n, a);
  }
  const double t1 = gg > 0 ? tg / gg : 0;
  double error = 0;
  for (const auto& [n, t] : points) error += (t - t1 * Shape(n, a)) * (t - t1 * Shape(n, a));
  return {t1, error};
}

// Least squares over a in [0, 1]: a coarse grid (the error need not be
// unimodal over the whole range), then a golden-section search around the
// best grid point; returns (t1, a).
std::pair<double, double> Fit(const std::vector<std::pair<double, double>>& points) {
  if (points.size() <= 1) return {points.empty() ? 0 : FitT1(points, 0).first, 0};
  constexpr int kGrid = 20;
  auto error = [&](double a) { return FitT1(points, a).second; };
  int best = 0;
  for (int i = 1; i <= kGrid; ++i) {
    if (error(double(i) / kGrid) < error(double(best) / kGrid)) best = i;
  }
  double lo = std::max(0.0, double(best - 1) / kGrid);
  double hi = std::min(1.0, double(best + 1) / kGrid);
  const double r = 0.6180339887498949;
  for (int i = 0; i < 60; ++i) {
    const double x1 = hi - r * (hi - lo), x2 = lo + r * (hi - lo);
    if (error(x1) <= error(x2)) {
      hi = x2;
    } else {
      lo = x1;
    }
  }
  const double grid_a = double(best) / kGrid;
  const double a = error(grid_a) < error((lo + hi) / 2) ? grid_a : (lo + hi) / 2;
  return {FitT1(points, a).first, a};
}

}  // namespace

ThroughputModel::ThroughputModel(std::map<uint32_t, double> measured)
    : measured_(std::move(measured)) {
  const std::vector<std::pair<double, double>> points = Points(measured_);
  measured_any_ = !points.empty();
  std::tie(t1_, a_) = Fit(points);
}

double ThroughputModel::Expected(uint32_t world_size) const {
  if (world_size == 0) return 0;
  auto it = measured_.find(world_size);
  if (it != measured_.end()) return it->second;
  return t1_ * Shape(world_size, a_);
}

double ThroughputModel::Gain(uint32_t world_size) const {
  if (!measured_any_) return 1;
  const double now = Expected(world_size);
  const double next = Expected(world_size + 1);
  if (now <= 0) return next > 0 ? 1 : 0;
  return next / now - 1;
}

double ExpectedThroughput(const std::map<uint32_t, double>& measured, uint32_t world_size) {
  return ThroughputModel(measured).Expected(world_size);
}

double MarginalGain(const std::map<uint32_t, double>& measured, uint32_t world_size) {
  return ThroughputModel(measured).Gain(world_size);
}

}  // namespace ddp
