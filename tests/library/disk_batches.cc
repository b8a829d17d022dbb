// Reads a dataset from disk through ddp::DiskDataset and ddp::DistributedSampler
// in torch::data's DataLoader, as a program would, and saves every batch for
// the library's dataset test (tests/py/library_disk_dataset_test.py):
//   ddp_library_disk_batches JSON RANK WORLD SEED EPOCHS BATCH OUT
// OUT: a pickle (torch.load reads it) of [x0, y0, x1, y1, ...], the epochs'
// batches in order, without set_epoch between epochs (the sampler moves on,
// and the dataset's augmentation follows it). Exit 1 with the error on
// stderr.
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include "ddp/ddp.h"

int main(int argc, char** argv) {
  if (argc != 8) {
    std::cerr << "usage: ddp_library_disk_batches JSON RANK WORLD SEED EPOCHS BATCH OUT\n";
    return 2;
  }
  try {
    const uint64_t seed = std::strtoull(argv[4], nullptr, 10);
    auto data = ddp::DiskDataset::FromJson(argv[1], seed);
    ddp::DistributedSampler::Options options;
    options.seed = seed;
    ddp::DistributedSampler sampler(*data.size(), std::atoi(argv[2]), std::atoi(argv[3]), options);
    data.follow(sampler);
    auto loader = torch::data::make_data_loader(
        data, sampler, torch::data::DataLoaderOptions().batch_size(std::atoi(argv[6])));
    c10::impl::GenericList batches(c10::AnyType::get());
    for (int epoch = 0; epoch < std::atoi(argv[5]); ++epoch) {
      for (auto& batch : *loader) {
        batches.push_back(batch.data);
        batches.push_back(batch.target);
      }
    }
    const std::vector<char> bytes = torch::pickle_save(batches);
    std::ofstream(argv[7], std::ios::binary).write(bytes.data(), bytes.size());
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
