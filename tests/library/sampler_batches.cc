// Prints the batches ddp::DistributedSampler gives through torch::data's
// DataLoader, one list of indices per line, for three epochs in a row
// without set_epoch (the sampler moves the epoch on by itself), for the
// sampler test (tests/py/library_sampler_test.py). Reads one case per line
// from stdin, "N WORLD RANK SEED EPOCH SHUFFLE DROP_LAST BATCH", and ends
// each case's output with "end".
#include <torch/torch.h>

#include <iostream>
#include <sstream>
#include <string>

#include "ddp/distributed_sampler.h"

namespace {

// Sample i is the index i itself.
class Indices : public torch::data::datasets::Dataset<Indices, int64_t> {
 public:
  explicit Indices(size_t n) : n_(n) {}
  int64_t get(size_t i) override { return static_cast<int64_t>(i); }
  torch::optional<size_t> size() const override { return n_; }

 private:
  size_t n_;
};

// One case: N WORLD RANK SEED EPOCH SHUFFLE DROP_LAST BATCH.
void PrintCase(std::istringstream& in) {
  size_t n = 0, batch = 1;
  int world = 1, rank = 0, shuffle = 1, drop_last = 0;
  ddp::DistributedSampler::Options options;
  in >> n >> world >> rank >> options.seed >> options.epoch >> shuffle >> drop_last >> batch;
  options.shuffle = shuffle != 0;
  options.drop_last = drop_last != 0;
  ddp::DistributedSampler sampler(n, rank, world, options);
  auto loader = torch::data::make_data_loader(Indices(n), sampler,
                                              torch::data::DataLoaderOptions().batch_size(batch));
  for (int round = 0; round < 3; ++round) {
    std::ostringstream batches;
    for (const std::vector<int64_t>& b : *loader) {
      batches << "[";
      for (size_t i = 0; i < b.size(); ++i) batches << (i ? ", " : "") << b[i];
      batches << "]\n";
    }
    // The epoch this round's reset() started.
    std::cout << "epoch " << sampler.epoch() << "\n" << batches.str();
  }
  std::cout << "end\n";
}

}  // namespace

int main() {
  for (std::string line; std::getline(std::cin, line);) {
    if (line.empty()) continue;
    std::istringstream in(line);
    PrintCase(in);
  }
  return 0;
}
