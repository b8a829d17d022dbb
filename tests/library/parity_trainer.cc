// A user's own training loop on the ddp library, for the parity test
// (tests/py/library_parity_test.py): a C++ model with BatchNorm, a
// data-dependent branch and a branch never used, trained data-parallel from
// the weights and data the test wrote, writing each step's loss, an
// eval-mode loss on a probe batch before each step (it reads BatchNorm's
// running statistics: the buffers every rank takes from rank 0), and the
// final weights.
//
//   RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=P \
//     ddp_library_parity_trainer DIR [--accumulate|--mismatch|--nested_no_sync]
// --accumulate: each batch in two halves, the first under no_sync().
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "ddp/ddp.h"

namespace {

constexpr int64_t kInputs = 20;
constexpr int64_t kHidden = 32;
constexpr int64_t kClasses = 4;
constexpr int64_t kBatch = 16;

struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t hidden)
      : fc1(register_module("fc1", torch::nn::Linear(kInputs, hidden))),
        bn(register_module("bn", torch::nn::BatchNorm1d(hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, kClasses))),
        aux(register_module("aux", torch::nn::Linear(hidden, kClasses))),
        never(register_module("never", torch::nn::Linear(hidden, kClasses))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::relu(bn(fc1(x)));
    torch::Tensor out = fc2(h);
    // Used by a batch whose first feature is positive: on some ranks in
    // some steps, on every rank or none in others.
    if (x[0][0].item<float>() > 0) out = out + aux(h);
    return out;
  }

  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d bn;
  torch::nn::Linear fc2, aux, never;
};
TORCH_MODULE(Net);

torch::Tensor ReadFloats(const std::string& path, std::vector<int64_t> shape) {
  torch::Tensor t = torch::empty(shape, torch::kFloat32);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(t.data_ptr<float>()), t.nbytes());
  if (!in) throw std::runtime_error("can't read " + path);
  return t;
}

class FileDataset : public torch::data::datasets::Dataset<FileDataset> {
 public:
  explicit FileDataset(const std::string& dir) {
    std::ifstream meta(dir + "/n");
    int64_t n = 0;
    meta >> n;
    x_ = ReadFloats(dir + "/x.bin", {n, kInputs});
    y_ = ReadFloats(dir + "/y.bin", {n}).to(torch::kLong);
  }
  torch::data::Example<> get(size_t i) override { return {x_[i], y_[i]}; }
  torch::optional<size_t> size() const override { return x_.size(0); }

 private:
  torch::Tensor x_, y_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr
        << "usage: ddp_library_parity_trainer DIR [--accumulate|--mismatch|--nested_no_sync]\n";
    return 2;
  }
  const std::string dir = argv[1];
  const std::string flag = argc > 2 ? argv[2] : "";
  torch::set_num_threads(1);
  try {
    std::unique_ptr<ddp::Session> session = ddp::Session::FromEnvironment();
    // --mismatch: rank 1 builds a wider hidden layer.
    Net net(flag == "--mismatch" && session->rank() == 1 ? kHidden + 1 : kHidden);
    if (flag != "--mismatch") {
      torch::NoGradGuard no_grad;
      for (auto& p : net->named_parameters()) {
        p.value().copy_(ReadFloats(dir + "/init/" + p.key() + ".bin", p.value().sizes().vec()));
      }
    }
    ddp::DistributedDataParallel model(*session, net.ptr(), {/*bucket_cap_mb=*/0.001});
    if (flag == "--nested_no_sync") {
      auto outer = model.no_sync();
      auto inner = model.no_sync();  // throws
    }
    FileDataset dataset(dir);
    ddp::DistributedSampler sampler(*dataset.size(), *session, {/*seed=*/7});
    auto loader =
        torch::data::make_data_loader(dataset.map(torch::data::transforms::Stack<>()), sampler,
                                      torch::data::DataLoaderOptions().batch_size(kBatch));
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    const std::string tag = flag == "--accumulate" ? "acc-" : "";
    std::ofstream losses(dir + "/" + tag + "losses-" + std::to_string(session->rank()) + ".txt");
    std::ofstream eval_losses(dir + "/" + tag + "eval-" + std::to_string(session->rank()) + ".txt");
    const torch::Tensor probe_x =
        torch::stack({dataset.get(0).data, dataset.get(1).data, dataset.get(2).data});
    const torch::Tensor probe_y =
        torch::stack({dataset.get(0).target, dataset.get(1).target, dataset.get(2).target});
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (auto& batch : *loader) {
        {
          torch::NoGradGuard no_grad;
          net->eval();
          char line[64];
          std::snprintf(line, sizeof(line), "%.9g\n",
                        torch::cross_entropy_loss(net->forward(probe_x), probe_y).item<double>());
          eval_losses << line;
          net->train();
        }
        optimizer.zero_grad();
        double step_loss = 0;
        if (flag == "--accumulate") {
          const std::vector<torch::Tensor> x = batch.data.chunk(2), y = batch.target.chunk(2);
          {
            auto local_only = model.no_sync();
            torch::Tensor loss = torch::cross_entropy_loss(net->forward(x[0]), y[0]) / 2;
            loss.backward();
            step_loss += loss.item<double>();
          }
          torch::Tensor loss = torch::cross_entropy_loss(net->forward(x[1]), y[1]) / 2;
          loss.backward();
          step_loss += loss.item<double>();
        } else {
          torch::Tensor loss = torch::cross_entropy_loss(net->forward(batch.data), batch.target);
          loss.backward();
          step_loss = loss.item<double>();
        }
        optimizer.step();
        char line[64];
        std::snprintf(line, sizeof(line), "%.9g\n", step_loss);
        losses << line;
      }
    }
    if (session->rank() == 0) {
      auto named = net->named_parameters();
      for (auto& b : net->named_buffers()) {
        if (b.value().scalar_type() == torch::kFloat32) named.insert(b.key(), b.value());
      }
      for (auto& p : named) {
        std::ofstream out(dir + "/" + tag + "final-" + p.key() + ".bin", std::ios::binary);
        torch::Tensor t = p.value().contiguous();
        out.write(reinterpret_cast<const char*>(t.data_ptr<float>()), t.nbytes());
      }
    }
    std::cout << "rank " << session->rank() << " done over " << session->backend()
              << "; last reduction: " << model.last_reduction().buckets << " buckets, "
              << model.last_reduction().globally_unused_parameters << " globally unused\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
