// Reads "size seed epoch rank world shuffle drop_last" lines on stdin and
// prints DistributedSamplerIndices for each, space-separated, one line each;
// the parity test compares them with PyTorch's DistributedSampler.
#include <iostream>
#include <sstream>
#include <string>

#include "common/sampler.h"

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    ddp::SamplerOptions o;
    int shuffle = 1, drop_last = 0;
    in >> o.dataset_size >> o.seed >> o.epoch >> o.rank >> o.world_size >> shuffle >> drop_last;
    o.shuffle = shuffle != 0;
    o.drop_last = drop_last != 0;
    std::ostringstream out;
    for (int64_t i : ddp::DistributedSamplerIndices(o)) out << i << ' ';
    std::cout << out.str() << '\n';
  }
}
