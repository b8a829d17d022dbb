#include "worker/model.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

#include <torch/script.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_kinds.h"
#include "worker/elastic/torch_error.h"

namespace ddp {
namespace {

absl::Status WriteFile(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) return absl::FailedPreconditionError(absl::StrCat("output_path: can't write ", path));
  return absl::OkStatus();
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t in, int64_t classes)
      : fc1(register_module("fc1", torch::nn::Linear(in, 256))),
        fc2(register_module("fc2", torch::nn::Linear(256, 128))),
        fc3(register_module("fc3", torch::nn::Linear(128, classes))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = x.flatten(1);
    x = torch::relu(fc1(x));
    x = torch::relu(fc2(x));
    return fc3(x);
  }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

struct CnnImpl : torch::nn::Module {
  CnnImpl(int64_t channels, int64_t classes)
      : conv1(register_module(
            "conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, 16, 3).padding(1)))),
        conv2(register_module("conv2",
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)))),
        fc1(register_module("fc1", torch::nn::Linear(32 * 7 * 7, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, classes))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);
    x = torch::relu(fc1(x.flatten(1)));
    return fc2(x);
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Cnn);

torch::nn::Conv2d Conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

// torchvision's BasicBlock: two 3x3 convolutions with batch norm, and a 1x1
// projection on the shortcut where the shape changes.
struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1(register_module("conv1", Conv(in, out, 3, stride))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(out))),
        conv2(register_module("conv2", Conv(out, out, 3, 1))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out) {
      torch::nn::Sequential projection;
      projection->push_back(Conv(in, out, 1, stride));
      projection->push_back(torch::nn::BatchNorm2d(out));
      downsample = register_module("downsample", projection);
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor y = torch::relu(bn1(conv1(x)));
    y = bn2(conv2(y));
    return torch::relu(y + (downsample ? downsample->forward(x) : x));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(BasicBlock);

// ResNet-18 as trained on CIFAR: torchvision's layers and names, with a 3x3
// stem and no max-pool (32x32 inputs). 11.2 M parameters, 44.7 MB of fp32
// gradients: the size where all-reduce across a network link matters.
struct ResNet18Impl : torch::nn::Module {
  ResNet18Impl(int64_t channels, int64_t classes)
      : conv1(register_module("conv1", Conv(channels, 64, 3, 1))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(64))),
        layer1(register_module("layer1", Layer(64, 64, 1))),
        layer2(register_module("layer2", Layer(64, 128, 2))),
        layer3(register_module("layer3", Layer(128, 256, 2))),
        layer4(register_module("layer4", Layer(256, 512, 2))),
        fc(register_module("fc", torch::nn::Linear(512, classes))) {}
  static torch::nn::Sequential Layer(int64_t in, int64_t out, int64_t stride) {
    // One after the other: the order of a call's arguments is unspecified,
    // and the weights drawn must come in PyTorch's order.
    torch::nn::Sequential layer;
    layer->push_back(BasicBlock(in, out, stride));
    layer->push_back(BasicBlock(out, out, 1));
    return layer;
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn1(conv1(x)));
    x = layer4->forward(layer3->forward(layer2->forward(layer1->forward(x))));
    return fc(torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Sequential layer1, layer2, layer3, layer4;
  torch::nn::Linear fc;
};
TORCH_MODULE(ResNet18);

template <typename Net>
class NativeModel final : public Model {
 public:
  explicit NativeModel(Net net) : net_(std::move(net)) {}
  at::Tensor Forward(const at::Tensor& x) override { return net_->forward(x); }
  std::vector<NamedTensor> Parameters() override {
    std::vector<NamedTensor> out;
    for (const auto& p : net_->named_parameters()) {
      if (p.value().requires_grad()) out.emplace_back(p.key(), p.value());
    }
    return out;
  }
  std::vector<NamedTensor> Buffers() override {
    std::vector<NamedTensor> out;
    for (const auto& b : net_->named_buffers()) out.emplace_back(b.key(), b.value());
    return out;
  }
  void SetTraining(bool training) override { net_->train(training); }
  void To(const at::Device& device) override { net_->to(device); }
  absl::Status Save(const std::string& path) override {
    // CPU tensors, so that torch.load reads it on any machine.
    c10::Dict<std::string, at::Tensor> state;
    for (const auto& p : net_->named_parameters()) state.insert(p.key(), p.value().detach().cpu());
    for (const auto& b : net_->named_buffers()) state.insert(b.key(), b.value().detach().cpu());
    return WriteFile(path, torch::pickle_save(state));
  }

 private:
  Net net_;
};

class ScriptModel final : public Model {
 public:
  explicit ScriptModel(torch::jit::Module module) : module_(std::move(module)) {}
  at::Tensor Forward(const at::Tensor& x) override {
    c10::IValue out = module_.forward({x});
    if (!out.isTensor()) {
      throw std::runtime_error(
          absl::StrCat("forward returned ", out.tagKind(), ", not a tensor of logits"));
    }
    return out.toTensor();
  }
  std::vector<NamedTensor> Parameters() override {
    std::vector<NamedTensor> out;
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
      if (p.value.requires_grad()) out.emplace_back(p.name, p.value);
    }
    return out;
  }
  std::vector<NamedTensor> Buffers() override {
    std::vector<NamedTensor> out;
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) out.emplace_back(b.name, b.value);
    return out;
  }
  void SetTraining(bool training) override { module_.train(training); }
  void To(const at::Device& device) override { module_.to(device); }
  absl::Status Save(const std::string& path) override {
    try {
      if (DeviceOf(*this).is_cpu()) {
        module_.save(path);
      } else {
        // A CPU copy, so that torch.jit.load reads it on any machine.
        torch::jit::Module copy = module_.clone();
        copy.to(at::kCPU);
        copy.save(path);
      }
    } catch (const std::exception& e) {
      return TorchErrorStatus(absl::StatusCode::kFailedPrecondition,
                              absl::StrCat("output_path: can't write ", path), e);
    }
    return absl::OkStatus();
  }

 private:
  torch::jit::Module module_;
};

}  // namespace

namespace {

absl::StatusOr<std::unique_ptr<Model>> LoadScriptModel(const v1::ModelSpec& spec,
                                                       InputFiles* inputs) {
  InputFiles unpinned;
  absl::StatusOr<std::string> bytes =
      (inputs ? inputs : &unpinned)->Read("model.path", spec.path());
  if (!bytes.ok()) return bytes.status();
  try {
    // From the bytes read (and pinned), never the path again.
    std::istringstream in(std::move(*bytes));
    return std::unique_ptr<Model>(new ScriptModel(torch::jit::load(in)));
  } catch (const std::exception& e) {
    return TorchErrorStatus(absl::StatusCode::kInvalidArgument,
                            absl::StrCat("model.path: ", spec.path(),
                                         " is not a TorchScript module saved with torch.jit.save"),
                            e);
  }
}

absl::StatusOr<std::unique_ptr<Model>> MakeCnn(const std::vector<int64_t>& sample_shape,
                                               int64_t num_classes) {
  // Grey (Fashion-MNIST's) or colour (an image folder's, which decodes to
  // RGB) 28x28 images.
  if (sample_shape != std::vector<int64_t>{1, 28, 28} &&
      sample_shape != std::vector<int64_t>{3, 28, 28}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.kind: \"cnn\" takes 1x28x28 or 3x28x28 images; this dataset's samples are ",
        ShapeString(sample_shape),
        " (for an image folder, end its transforms with a crop or resize to 28); or use "
        "\"mlp\" or a TorchScript model"));
  }
  return std::unique_ptr<Model>(new NativeModel<Cnn>(Cnn(sample_shape[0], num_classes)));
}

absl::StatusOr<std::unique_ptr<Model>> MakeResNet18(const std::vector<int64_t>& sample_shape,
                                                    int64_t num_classes) {
  if (sample_shape.size() != 3 || sample_shape[1] < 8 || sample_shape[2] < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.kind: \"resnet18\" takes CxHxW images of at least 8x8 (3x32x32 as in CIFAR); "
        "this dataset's samples are ",
        ShapeString(sample_shape)));
  }
  return std::unique_ptr<Model>(new NativeModel<ResNet18>(ResNet18(sample_shape[0], num_classes)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> MakeModel(const v1::ModelSpec& spec,
                                                 const std::vector<int64_t>& sample_shape,
                                                 int64_t num_classes, uint64_t seed,
                                                 InputFiles* inputs) {
  const v1::ModelKind kind = ModelKindOf(spec);
  if (kind == v1::MODEL_KIND_TORCHSCRIPT) return LoadScriptModel(spec, inputs);
  torch::manual_seed(seed);
  int64_t in = 1;
  for (int64_t d : sample_shape) in *= d;
  switch (kind) {
    case v1::MODEL_KIND_MLP:
      return std::unique_ptr<Model>(new NativeModel<Mlp>(Mlp(in, num_classes)));
    case v1::MODEL_KIND_CNN:
      return MakeCnn(sample_shape, num_classes);
    case v1::MODEL_KIND_RESNET18:
      return MakeResNet18(sample_shape, num_classes);
    case v1::MODEL_KIND_TORCHSCRIPT:  // above
    case v1::MODEL_KIND_PROGRAM:      // a program builds its own
    case v1::MODEL_KIND_UNKNOWN:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("model.kind: unknown \"", spec.kind(), "\""));
}

absl::Status SaveOutput(Model& model, const std::string& path, bool overwrite) {
  const std::string temporary = absl::StrCat(path, ".tmp-", ::getpid());
  if (absl::Status s = model.Save(temporary); !s.ok()) {
    std::remove(temporary.c_str());
    return s;
  }
  int failed = ::renameat2(AT_FDCWD, temporary.c_str(), AT_FDCWD, path.c_str(),
                           overwrite ? 0 : RENAME_NOREPLACE);
  if (failed != 0 && errno == EINVAL && !overwrite) {
    // A filesystem without RENAME_NOREPLACE: link() never replaces either.
    failed = ::link(temporary.c_str(), path.c_str());
  }
  const int error = errno;
  std::remove(temporary.c_str());
  if (failed == 0) return absl::OkStatus();
  if (error == EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("output_path: ", path,
                     " appeared during training and the job does not set "
                     "overwrite_output; it was left alone"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("output_path: can't write ", path, ": ", ::strerror(error)));
}

at::Device DeviceOf(Model& model) {
  const std::vector<NamedTensor> params = model.Parameters();
  return params.empty() ? at::Device(at::kCPU) : params.front().second.device();
}

absl::Status CheckModelFits(Model& model, const v1::ModelSpec& spec,
                            const std::vector<int64_t>& sample_shape, int64_t num_classes,
                            int64_t batch) {
  const std::string field =
      ModelKindOf(spec) == v1::MODEL_KIND_TORCHSCRIPT ? "model.path" : "model.kind";
  std::vector<int64_t> batch_shape = {batch};
  batch_shape.insert(batch_shape.end(), sample_shape.begin(), sample_shape.end());
  at::Tensor out;
  try {
    torch::NoGradGuard no_grad;
    model.SetTraining(false);
    out = model.Forward(torch::zeros(batch_shape, torch::TensorOptions().device(DeviceOf(model))));
    model.SetTraining(true);
  } catch (const std::exception& e) {
    return TorchErrorStatus(absl::StatusCode::kInvalidArgument,
                            absl::StrCat(field, ": forward fails on a batch of shape ",
                                         ShapeString(batch_shape), " from the dataset"),
                            e);
  }
  const std::string wanted = absl::StrCat("; it must return [", batch,
                                          ", C] floating-point logits with C >= ", num_classes,
                                          " (the dataset's classes)");
  const std::string on =
      absl::StrCat(field, ": forward on a batch of shape ", ShapeString(batch_shape), " returns ");
  // Only what the check itself chose or can name (dimensions, dtype) is
  // told back: never a size the model computed.
  if (out.dim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(on, "a tensor of ", std::min<int64_t>(out.dim(), 9),
                     out.dim() > 9 ? " or more" : "", " dimensions", wanted));
  }
  if (!out.is_floating_point()) {
    return absl::InvalidArgumentError(
        absl::StrCat(on, "a tensor of dtype ", c10::toString(out.scalar_type()), wanted));
  }
  if (out.size(0) != batch) {
    return absl::InvalidArgumentError(
        absl::StrCat(on, "logits for a different number of samples", wanted));
  }
  if (out.size(1) < num_classes) {
    return absl::InvalidArgumentError(absl::StrCat(on, "fewer logits per sample", wanted));
  }
  if (model.Parameters().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": the model has no trainable parameters"));
  }
  return absl::OkStatus();
}

}  // namespace ddp
