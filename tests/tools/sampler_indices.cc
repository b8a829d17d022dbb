// Reads "size seed epoch rank world shuffle drop_last [cursor]" lines on
// stdin and prints, space-separated, one line each, DistributedSamplerIndices,
// or ElasticSamplerIndices from the cursor where a line has one; the parity
// test compares them with PyTorch's DistributedSampler.
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/sampler.h"

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    ddp::SamplerOptions o;
    int shuffle = 1, drop_last = 0;
    uint64_t cursor = 0;
    in >> o.dataset_size >> o.seed >> o.epoch >> o.rank >> o.world_size >> shuffle >> drop_last;
    const bool has_cursor = static_cast<bool>(in >> cursor);
    o.shuffle = shuffle != 0;
    o.drop_last = drop_last != 0;
    std::ostringstream out;
    const std::vector<int64_t> indices =
        has_cursor ? ddp::ElasticSamplerIndices(o, cursor) : ddp::DistributedSamplerIndices(o);
    for (int64_t i : indices) out << i << ' ';
    std::cout << out.str() << '\n';
  }
}
