// The daemon's built-in "mlp" job (Fashion-MNIST, batch 64 per rank, SGD
// lr 0.01 momentum 0.9, one epoch) written as a user's own loop on the ddp
// library, for bench/run_benchmarks.py: it writes one StepRecord-shaped
// JSON line per step ({"time", "rank", "report": {"step", "loss",
// "samples", "step_seconds"}}) to the file named by its argument.
//
//   ddp-run --nproc 2 --threads 1 -- ddp_bench_library_mlp OUT_PREFIX
#include <torch/torch.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include "ddp/ddp.h"

namespace {

torch::Tensor ReadIdx(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error("can't open " + path);
  std::string bytes;
  char buf[1 << 16];
  for (int n; (n = gzread(f, buf, sizeof(buf))) > 0;) bytes.append(buf, n);
  gzclose(f);
  auto be32 = [&](size_t at) {
    const auto* p = reinterpret_cast<const unsigned char*>(bytes.data() + at);
    return (int64_t{p[0]} << 24) | (p[1] << 16) | (p[2] << 8) | p[3];
  };
  const int dims = bytes[3];
  std::vector<int64_t> shape;
  for (int d = 0; d < dims; ++d) shape.push_back(be32(4 + 4 * d));
  const size_t offset = 4 + 4 * dims;
  return torch::from_blob(bytes.data() + offset, shape, torch::kUInt8).clone();
}

// Whole batches by index_select: what a performance-minded torch::data
// user writes instead of stacking samples one by one.
class FashionMnist
    : public torch::data::datasets::BatchDataset<FashionMnist, torch::data::Example<>> {
 public:
  FashionMnist() {
    const std::string dir = "/usr/share/datasets/fashion-mnist/";
    x_ = ((ReadIdx(dir + "train-images-idx3-ubyte.gz").to(torch::kFloat32) / 255.0 - 0.2860) /
          0.3530)
             .unsqueeze(1);
    y_ = ReadIdx(dir + "train-labels-idx1-ubyte.gz").to(torch::kLong);
  }
  torch::data::Example<> get_batch(torch::ArrayRef<size_t> indices) override {
    torch::Tensor i = torch::tensor(std::vector<int64_t>(indices.begin(), indices.end()));
    return {x_.index_select(0, i), y_.index_select(0, i)};
  }
  torch::optional<size_t> size() const override { return y_.size(0); }

 private:
  torch::Tensor x_, y_;
};

struct MlpImpl : torch::nn::Module {
  torch::nn::Linear fc1{register_module("fc1", torch::nn::Linear(784, 256))},
      fc2{register_module("fc2", torch::nn::Linear(256, 128))},
      fc3{register_module("fc3", torch::nn::Linear(128, 10))};
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1(x.flatten(1)));
    return fc3(torch::relu(fc2(x)));
  }
};
TORCH_MODULE(Mlp);

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: ddp_bench_library_mlp OUT_PREFIX (writes OUT_PREFIX-RANK.jsonl)\n";
    return 2;
  }
  const char* threads = std::getenv("OMP_NUM_THREADS");
  torch::set_num_threads(threads ? std::atoi(threads) : 1);
  auto session = ddp::Session::FromEnvironment();
  FashionMnist data;
  torch::manual_seed(1);
  Mlp net;
  ddp::DistributedDataParallel ddp(*session, net.ptr());
  ddp::DistributedSampler sampler(*data.size(), *session, {/*seed=*/1});
  auto loader = torch::data::make_data_loader(data, sampler, /*batch_size=*/64);
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  std::ofstream out(std::string(argv[1]) + "-" + std::to_string(session->rank()) + ".jsonl");
  uint64_t step = 0;
  double start = Now();
  for (auto& batch : *loader) {
    optimizer.zero_grad();
    torch::Tensor loss = torch::cross_entropy_loss(net->forward(batch.data), batch.target);
    loss.backward();
    optimizer.step();
    const double now = Now();
    char line[256];
    std::snprintf(line, sizeof(line),
                  "{\"time\": %.6f, \"rank\": %d, \"report\": {\"step\": %llu, \"loss\": %.9g, "
                  "\"samples\": %lld, \"step_seconds\": %.6f}}\n",
                  now, session->rank(), static_cast<unsigned long long>(++step),
                  loss.item<double>(), static_cast<long long>(batch.target.size(0)), now - start);
    out << line;
    start = Now();
  }
  return 0;
}
