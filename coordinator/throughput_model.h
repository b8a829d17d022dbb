// What a job's samples/s is expected to be on a number of workers it may not
// have trained at, from the sizes it has: the measurement itself where there
// is one, else the model T(n) = t1 * n / (1 + a * (n - 1)) fitted to the
// measurements by least squares (a in [0, 1]: 0 is linear scaling, 1 none).
// The scheduling policy grows and shrinks jobs by it; a pure function of the
// measurements, so it is tested as a table.
#ifndef DDP_COORDINATOR_THROUGHPUT_MODEL_H_
#define DDP_COORDINATOR_THROUGHPUT_MODEL_H_

#include <cstdint>
#include <map>

namespace ddp {

// Fitted once, asked many times (the policy asks at every size it plans).
// Any thread; immutable once built.
class ThroughputModel {
 public:
  // `measured`: samples/s at each world size the job has trained at (a
  // world of 0 says nothing). One measurement fits any a, so it gets a = 0,
  // which is optimistic and so tries the job at a larger size.
  explicit ThroughputModel(std::map<uint32_t, double> measured);

  // Samples/s on `world_size` workers: 0 on none, or with no measurement at
  // all.
  double Expected(uint32_t world_size) const;
  // What one more worker gains a job on `world_size` workers, relative to
  // what it has: T(n + 1) / T(n) - 1; 1 without measurements (an unmeasured
  // job is tried larger first) and 1 from a size expected to make no
  // progress to one that does. Comparable across jobs whatever their
  // samples/s.
  double Gain(uint32_t world_size) const;
  bool measured() const { return measured_any_; }
  double t1() const { return t1_; }
  double a() const { return a_; }

 private:
  std::map<uint32_t, double> measured_;
  bool measured_any_ = false;
  double t1_ = 0;
  double a_ = 0;
};

// ThroughputModel(measured).Expected(world_size).
double ExpectedThroughput(const std::map<uint32_t, double>& measured, uint32_t world_size);

// ThroughputModel(measured).Gain(world_size).
double MarginalGain(const std::map<uint32_t, double>& measured, uint32_t world_size);

}  // namespace ddp

#endif  // DDP_COORDINATOR_THROUGHPUT_MODEL_H_
