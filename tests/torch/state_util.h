// Models, optimizers and training states for the state codec and
// checkpoint tests.
#ifndef DDP_TESTS_TORCH_STATE_UTIL_H_
#define DDP_TESTS_TORCH_STATE_UTIL_H_

#include <torch/script.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "worker/elastic/state_codec.h"
#include "worker/model.h"
#include "worker/model_state.h"

namespace ddp {

// A TorchScript module built and saved from C++ (no Python at test time):
// two linear submodules (qualified names "fc1.weight") and a buffer.
inline const std::string& TorchScriptFile() {
  static const std::string* path = [] {
    auto linear = [](const std::string& name, int64_t in, int64_t out) {
      torch::jit::Module m(name);
      m.register_parameter("weight", (torch::randn({out, in}) * 0.05).requires_grad_(), false);
      m.register_parameter("bias", torch::zeros({out}).requires_grad_(), false);
      m.define(R"(
def forward(self, x):
    return x.matmul(self.weight.t()) + self.bias
)");
      return m;
    };
    torch::manual_seed(0);
    torch::jit::Module net("Net");
    net.register_module("fc1", linear("Fc1", 784, 32));
    net.register_module("fc2", linear("Fc2", 32, 10));
    net.register_buffer("scale", torch::ones({10}));
    // C++'s define sees `self` as a plain class: submodules are called
    // through forward.
    net.define(R"(
def forward(self, x):
    return self.fc2.forward(torch.relu(self.fc1.forward(x.flatten(1)))) * self.scale
)");
    auto* p = new std::string(::testing::TempDir() + "/ddp-state-codec-net.pt");
    net.save(*p);
    return p;
  }();
  return *path;
}

// "mlp", "cnn" or "torchscript", for 1x28x28 samples.
inline std::unique_ptr<Model> BuildModel(const std::string& kind, uint64_t seed,
                                         int64_t classes = 10) {
  v1::ModelSpec spec;
  spec.set_kind(kind);
  if (kind == "torchscript") spec.set_path(TorchScriptFile());
  absl::StatusOr<std::unique_ptr<Model>> model = MakeModel(spec, {1, 28, 28}, classes, seed);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

// As the trainer builds it: over Model::Parameters(), in order.
inline std::unique_ptr<torch::optim::Optimizer> BuildOptimizer(const std::string& kind,
                                                               Model& model) {
  std::vector<at::Tensor> params;
  for (const auto& [name, t] : model.Parameters()) params.push_back(t);
  if (kind == "adam") {
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-3));
  }
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
}

// One optimizer step on a batch drawn from `data_seed` (its own generator:
// the default one is left alone).
inline void TrainStep(Model& model, torch::optim::Optimizer& optimizer, uint64_t data_seed) {
  at::Generator gen = at::detail::createCPUGenerator(data_seed);
  at::Tensor x = at::randn({8, 1, 28, 28}, gen);
  at::Tensor y = at::randint(10, {8}, gen);
  optimizer.zero_grad();
  torch::cross_entropy_loss(model.Forward(x), y).backward();
  optimizer.step();
}

inline void ScaleBuffers(Model& model, double factor) {
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : model.Buffers()) t.mul_(factor);
}

inline v1::TrainingStateHeader TestHeader(const std::string& job_id = "job-a", uint64_t step = 3) {
  v1::TrainingStateHeader header;
  header.set_job_id(job_id);
  header.set_spec_digest("spec-1");
  header.set_step(step);
  header.set_epoch(1);
  header.set_cursor(96);
  header.set_world_size(2);
  header.set_generation(4);
  return header;
}

inline StateIdentity TestIdentity() { return StateIdentity{"job-a", "spec-1"}; }

// Every byte of a model's and optimizer's state, and the RNG's.
inline std::string Snapshot(Model& model, torch::optim::Optimizer& optimizer) {
  absl::StatusOr<std::string> bytes = EncodeTrainingState(TestHeader(), model, optimizer);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *bytes : "";
}

// About 11M parameters in three 1920x1920 layers.
class BigModel final : public Model {
 public:
  explicit BigModel(uint64_t seed) {
    torch::manual_seed(seed);
    for (int i = 0; i < 3; ++i) net_->push_back(torch::nn::Linear(1920, 1920));
  }
  at::Tensor Forward(const at::Tensor& x) override { return net_->forward(x); }
  std::vector<NamedTensor> Parameters() override {
    std::vector<NamedTensor> out;
    for (const auto& p : net_->named_parameters()) out.emplace_back(p.key(), p.value());
    return out;
  }
  std::vector<NamedTensor> Buffers() override { return {}; }
  void SetTraining(bool training) override { net_->train(training); }
  void To(const at::Device& device) override { net_->to(device); }
  absl::Status Save(const std::string&) override { return absl::UnimplementedError("test"); }

 private:
  torch::nn::Sequential net_;
};

inline void BigStep(Model& model, torch::optim::Optimizer& optimizer) {
  at::Generator gen = at::detail::createCPUGenerator(5);
  optimizer.zero_grad();
  model.Forward(at::randn({4, 1920}, gen)).square().mean().backward();
  optimizer.step();
}

}  // namespace ddp

#endif  // DDP_TESTS_TORCH_STATE_UTIL_H_
