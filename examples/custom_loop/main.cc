// Your own LibTorch training loop, data-parallel: a custom model, a custom
// dataset (a file this program writes), a custom loss and a learning-rate
// schedule. Run it on 2 processes with
//   ddp-run --nproc 2 -- ./custom_loop --data /tmp/spirals --epochs 30
// or start each rank yourself against a coordinator running a job with
// model.kind "program":
//   DDP_COORDINATOR=10.0.0.1:29400 LOCAL_RANK=0 ./custom_loop ...
// (examples/custom_loop/program-job.json is such a job:
//   ddp-coordinator --job examples/custom_loop/program-job.json)
// or with torchrun's variables and no coordinator:
//   DDP_STORE_SECRET=S RANK=0 WORLD_SIZE=2 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 ./custom_loop
// (S: the same random secret on every rank, e.g. openssl rand -hex 16)
// --accumulate K: each optimizer step accumulates K batches (the first K-1
// under no_sync()).
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

// Two interleaved spirals, one per class: `n` points written as "x,y,label".
void WriteSpirals(const std::string& path, int n) {
  std::ofstream out(path);
  for (int i = 0; i < n; ++i) {
    const int label = i % 2;
    const double r = 0.1 + 3.0 * (i / 2) / (n / 2), t = 1.75 * r + label * M_PI;
    out << r * std::cos(t) << "," << r * std::sin(t) << "," << label << "\n";
  }
}

class Spirals : public torch::data::datasets::Dataset<Spirals> {
 public:
  explicit Spirals(const std::string& path) {
    std::ifstream in(path);
    std::vector<float> xy;
    std::vector<int64_t> labels;
    for (float x, y; in >> x && in.ignore() && in >> y && in.ignore();) {
      int64_t label;
      in >> label;
      xy.insert(xy.end(), {x, y});
      labels.push_back(label);
    }
    x_ = torch::tensor(xy).view({-1, 2});
    y_ = torch::tensor(labels);
  }
  torch::data::Example<> get(size_t i) override { return {x_[i], y_[i]}; }
  torch::optional<size_t> size() const override { return y_.size(0); }
  const torch::Tensor& x() const { return x_; }
  const torch::Tensor& y() const { return y_; }

 private:
  torch::Tensor x_, y_;
};

struct ClassifierImpl : torch::nn::Module {
  torch::nn::Linear l1{register_module("l1", torch::nn::Linear(2, 64))},
      l2{register_module("l2", torch::nn::Linear(64, 64))},
      out{register_module("out", torch::nn::Linear(64, 2))};
  torch::Tensor forward(torch::Tensor x) {
    x = torch::tanh(l1(x));
    return out(x + torch::tanh(l2(x)));  // a residual block
  }
};
TORCH_MODULE(Classifier);

// Cross-entropy with label smoothing, written out: a loss of our own.
torch::Tensor SmoothedCrossEntropy(const torch::Tensor& logits, const torch::Tensor& target,
                                   double smoothing = 0.1) {
  const torch::Tensor logp = torch::log_softmax(logits, 1);
  const torch::Tensor nll = -logp.gather(1, target.unsqueeze(1)).squeeze(1);
  return ((1 - smoothing) * nll - smoothing * logp.mean(1)).mean();
}

int Train(int argc, char** argv) {
  std::string dir = "/tmp/ddp-spirals";
  int epochs = 30;
  double lr = 0.1;
  int accumulate = 1;
  int batch_size = 32;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--data") dir = value;
    if (flag == "--epochs") epochs = std::stoi(value);
    if (flag == "--lr") lr = std::stod(value);
    if (flag == "--accumulate") accumulate = std::max(1, std::stoi(value));
    if (flag == "--batch") batch_size = std::max(1, std::stoi(value));
  }
  torch::set_num_threads(1);
  auto session = ddp::Session::FromEnvironment();  // DDP_COORDINATOR, or torchrun's variables
  const std::string path = dir + "/spirals.csv";
  if (session->rank() == 0 && !std::filesystem::exists(path)) {
    std::filesystem::create_directories(dir);
    WriteSpirals(path + ".tmp", 4096);
    std::filesystem::rename(path + ".tmp", path);
  }
  session->barrier();  // the file exists for every rank on this machine

  Spirals data(path);
  Classifier model;
  const torch::Device device = session->device();  // cuda:LOCAL_RANK where there is one
  model->to(device);
  ddp::DistributedDataParallel ddp(*session, model.ptr());  // rank 0's weights everywhere
  ddp::DistributedSampler sampler(*data.size(), *session, {session->sampler_seed()});
  auto loader = torch::data::make_data_loader(data.map(torch::data::transforms::Stack<>()), sampler,
                                              batch_size);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
  // What travels when a rank is lost or joins (with a coordinator): the job
  // re-forms at the next batch, and a program started into it begins here.
  session->set_elastic_state({model.ptr(), &optimizer});

  // Gradient accumulation counts its micro-batches; a re-formation (a rank
  // lost or joining, at the next batch) drops the ones accumulated so far
  // and changes the generation: the count starts over.
  uint64_t generation = session->generation();
  int micro = 0;
  for (int epoch = session->start_epoch(); epoch < epochs;
       ++epoch) {  // the sampler moves on itself
    const double epoch_lr = lr * 0.5 * (1 + std::cos(M_PI * epoch / epochs));  // cosine decay
    static_cast<torch::optim::SGDOptions&>(optimizer.param_groups()[0].options()).lr(epoch_lr);
    torch::Tensor sum = torch::zeros({2});  // loss sum and batches, over the ranks below
    for (auto& batch : *loader) {
      if (session->generation() != generation) {
        generation = session->generation();
        micro = 0;
      }
      if (micro == 0) optimizer.zero_grad();
      torch::Tensor loss =
          SmoothedCrossEntropy(model->forward(batch.data.to(device)), batch.target.to(device));
      sum += torch::stack({loss.detach().cpu(), torch::ones({})});
      if (++micro < accumulate) {
        auto local_only = ddp.no_sync();  // accumulate on this rank only
        (loss / accumulate).backward();
        continue;
      }
      (loss / accumulate).backward();  // gradients averaged over the ranks when it returns
      optimizer.step();
      micro = 0;
      session->report_step(loss.item<double>(), batch.target.size(0), epoch);  // never blocks
    }
    session->all_reduce_sum(sum);
    if (session->rank() == 0 && (epoch % 5 == 0 || epoch == epochs - 1)) {
      std::cout << "epoch " << epoch << " loss " << (sum[0] / sum[1]).item<double>() << " lr "
                << epoch_lr << std::endl;
    }
  }
  if (session->rank() == 0) {
    torch::NoGradGuard no_grad;
    const double accuracy = (model->forward(data.x().to(device)).argmax(1).cpu() == data.y())
                                .to(torch::kFloat)
                                .mean()
                                .item<double>();
    std::cout << "accuracy " << accuracy << std::endl;
  }
  session->finish();  // the job succeeds once every rank has finished (throws if it failed)
  return 0;
}

int main(int argc, char** argv) {
  try {
    return Train(argc, argv);
  } catch (const ddp::Error& e) {  // the job failed or ended: say why, and exit non-zero
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
}
