// One sample at a time on one thread, what a loader thread does per image:
// read and decode the file, then RandomResizedCrop(SIZE),
// RandomHorizontalFlip, ToTensor and Normalize into a float buffer. Timed
// whole, and in its two halves (read+decode; the transforms on images
// decoded beforehand), so a change to either shows alone.
//
//   ddp_image_pipeline_bench ROOT SIZE [RUNS] [--dump FILE]
//
// Prints one JSON line per run and part; --dump writes every sample's
// tensor to FILE (float32, index order), to compare two builds to the bit.
#include <time.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "bench/training_pipeline.h"
#include "worker/data/image_decode.h"
#include "worker/data/image_folder.h"
#include "worker/data/image_pipeline.h"

namespace {

// The sample's tensor into `out` (3 * size * size floats).
void Transform(const ddp::ImagePipeline& pipeline, ddp::RgbImage image, int64_t index, float* out) {
  const int size = pipeline.steps.front().height;
  ddp::RunPipelineInto(pipeline, std::move(image), /*seed=*/1, /*epoch=*/0, index, size, size, out);
}

// Wall time and this thread's CPU time (the second is steadier where other
// processes share the cores).
struct Clock {
  std::chrono::steady_clock::time_point wall = std::chrono::steady_clock::now();
  double cpu = ThreadCpuSeconds();

  static double ThreadCpuSeconds() {
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9;
  }
};

void Report(const char* part, size_t images, const Clock& start) {
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start.wall).count();
  const double cpu = Clock::ThreadCpuSeconds() - start.cpu;
  std::cout << "{\"part\": \"" << part << "\", \"images\": " << images << ", \"seconds\": " << wall
            << ", \"images_per_sec\": " << images / wall
            << ", \"images_per_cpu_sec\": " << images / cpu << "}\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: ddp_image_pipeline_bench ROOT SIZE [RUNS] [--dump FILE]\n";
    return 1;
  }
  const int size = std::atoi(argv[2]);
  int runs = 3;
  std::string dump;
  for (int i = 3; i < argc; ++i) {
    if (std::strcmp(argv[i], "--dump") == 0 && i + 1 < argc) {
      dump = argv[++i];
    } else {
      runs = std::atoi(argv[i]);
    }
  }
  absl::StatusOr<ddp::ImageFolder> folder = ddp::ImageFolder::Scan(argv[1]);
  if (!folder.ok()) {
    std::cerr << folder.status().message() << "\n";
    return 2;
  }
  const ddp::ImagePipeline pipeline = ddp::TrainingPipeline(size);
  const size_t n = folder->size();
  std::vector<float> out(static_cast<size_t>(3) * size * size);
  if (!dump.empty()) {
    std::ofstream file(dump, std::ios::binary);
    for (size_t i = 0; i < n; ++i) {
      absl::StatusOr<ddp::RgbImage> image = ddp::ReadImage(folder->samples()[i].path);
      if (!image.ok()) return 2;
      Transform(pipeline, *std::move(image), static_cast<int64_t>(i), out.data());
      file.write(reinterpret_cast<const char*>(out.data()),
                 static_cast<std::streamsize>(out.size() * sizeof(float)));
    }
    return 0;
  }
  std::vector<ddp::RgbImage> decoded(n);
  for (int run = 0; run < runs; ++run) {
    Clock start;
    for (size_t i = 0; i < n; ++i) {
      absl::StatusOr<ddp::RgbImage> image = ddp::ReadImage(folder->samples()[i].path);
      if (!image.ok()) return 2;
      Transform(pipeline, *std::move(image), static_cast<int64_t>(i), out.data());
    }
    Report("whole", n, start);
    start = Clock();
    for (size_t i = 0; i < n; ++i) decoded[i] = *ddp::ReadImage(folder->samples()[i].path);
    Report("read+decode", n, start);
    start = Clock();
    for (size_t i = 0; i < n; ++i) {
      Transform(pipeline, decoded[i], static_cast<int64_t>(i), out.data());
    }
    Report("transforms", n, start);
  }
  return 0;
}
