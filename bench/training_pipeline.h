// The training pipeline the data benchmarks time, as bench/data_bench.py
// runs torchvision's: RandomResizedCrop(size), RandomHorizontalFlip, then
// ToTensor and ImageNet's Normalize.
#ifndef DDP_BENCH_TRAINING_PIPELINE_H_
#define DDP_BENCH_TRAINING_PIPELINE_H_

#include "worker/data/image_pipeline.h"

namespace ddp {

inline ImagePipeline TrainingPipeline(int size) {
  ImagePipeline pipeline;
  ImageStep crop;
  crop.kind = ImageStep::Kind::kRandomResizedCrop;
  crop.height = crop.width = size;
  ImageStep flip;
  flip.kind = ImageStep::Kind::kRandomHorizontalFlip;
  pipeline.steps = {crop, flip};
  pipeline.normalize = Normalization{{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}};
  return pipeline;
}

}  // namespace ddp

#endif  // DDP_BENCH_TRAINING_PIPELINE_H_
