// The image-folder loader's images/s: every image of ROOT once, in index
// order, batch after batch through ReadSampleBatch (what a worker's
// BatchLoader calls), on THREADS threads, with a training pipeline:
// RandomResizedCrop(SIZE), RandomHorizontalFlip, Normalize.
//
//   ddp_image_loader_bench ROOT THREADS SIZE [BATCH]
//
// Prints one JSON line: images, seconds, images_per_sec.
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <vector>

#include "absl/time/clock.h"
#include "bench/training_pipeline.h"
#include "worker/data/image_folder_source.h"
#include "worker/sample_batches.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: ddp_image_loader_bench ROOT THREADS SIZE [BATCH]\n";
    return 1;
  }
  const int threads = std::atoi(argv[2]);
  const int size = std::atoi(argv[3]);
  const int64_t batch = argc > 4 ? std::atoll(argv[4]) : 64;
  auto source = ddp::ImageFolderSource::Open(argv[1], ddp::TrainingPipeline(size), /*seed=*/1);
  if (!source.ok()) {
    std::cerr << source.status().message() << "\n";
    return 2;
  }
  std::vector<int64_t> indices((*source)->size());
  std::iota(indices.begin(), indices.end(), 0);
  const absl::Time start = absl::Now();
  for (size_t at = 0; at < indices.size(); at += batch) {
    const size_t n = std::min<size_t>(batch, indices.size() - at);
    auto read =
        ddp::ReadSampleBatch(**source, absl::MakeConstSpan(indices.data() + at, n), 0, threads);
    if (!read.ok()) {
      std::cerr << read.status().message() << "\n";
      return 2;
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::cout << "{\"images\": " << indices.size() << ", \"seconds\": " << seconds
            << ", \"images_per_sec\": " << indices.size() / seconds << "}\n";
  return 0;
}
