// A user's own training loop on the ddp library, for the parity test
// (tests/py/library_parity_test.py): a C++ model with BatchNorm, a
// data-dependent branch and a branch never used, trained data-parallel from
// the weights and data the test wrote, writing each step's loss, an
// eval-mode loss on a probe batch before each step (it reads BatchNorm's
// running statistics: the buffers every rank takes from rank 0), and the
// final weights.
//
//   RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=P (environment)
//   ddp_library_parity_trainer DIR [--accumulate|--torchscript|--mismatch|--nested_no_sync|
//                                   --no_param_steps|--zero_loss_steps|--extra_barrier|
//                                   --diverge|--epoch_end_loss|--next_epoch_loss|
//                                   --partial_last_step]
// --accumulate: each batch in two halves, the first under no_sync().
// --torchscript: DIR/net.pt (the network scripted in Python) instead of Net.
// --no_param_steps: on every third step rank 1's loss reaches no parameter
// (computed from the network's output detached); --zero_loss_steps: on the
// same steps its loss is the network's times zero. Both give every
// parameter a zero gradient on rank 1 there, so they must train alike.
// --extra_barrier: rank 1 calls barrier() once where rank 0 does not.
// --diverge: rank 1 nudges aux.bias after step 50, so that the replicas
// differ there (the coordinator compares them at step 100).
// --epoch_end_loss (with --elastic, three ranks, a coordinator): steps of
// two batches, the first under no_sync(), that run on across passes (as
// examples/custom_loop's --accumulate does), and an all-reduce of each
// pass's loss at its end. At the end of the first pass (43 batches a rank:
// its last is a micro-batch of a step still open), rank 2 dies before that
// all-reduce and rank 1 lingers in its last micro-batch, so that it hears of
// the loss between collectives while rank 0 waits in the all-reduce.
// --next_epoch_loss: the same loop, but rank 2 dies at its first batch of the
// second pass, so the step the first pass left open fails in its backward.
// --partial_last_step (with --elastic, two ranks, a coordinator): a step a
// batch and an all-reduce of each pass's loss at its end; the first pass's
// last synchronized backward completes on both ranks and reads as failed on
// rank 1 (DDP_TEST_FAIL_STEP), so that rank 0 goes on to that all-reduce
// while rank 1 drops the step.
// Then, optionally: --elastic (the model, or the TorchScript module, and the
// optimizer are the elastic state), --epochs=N (2 by default).
// Each rank reports its steps (to a coordinator, if joined), finishes, and
// prints a digest of its final parameters.
#include <torch/script.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
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

// FNV-1a over the tensors' bytes: equal exactly when they are bit-equal.
std::string Digest(const std::vector<torch::Tensor>& tensors) {
  uint64_t h = 1469598103934665603ull;
  for (const torch::Tensor& t : tensors) {
    const torch::Tensor c = t.contiguous();
    const auto* p = static_cast<const unsigned char*>(c.data_ptr());
    for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(h));
  return text;
}

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

// The model as the loop sees it, whichever kind it is.
struct Model {
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::function<void(bool)> train;
  std::vector<torch::Tensor> parameters;
  // Parameters and float buffers by name, for the final comparison.
  std::function<std::vector<std::pair<std::string, torch::Tensor>>()> state;
};

Model FromNet(Net net) {
  Model m;
  m.forward = [p = net.ptr()](const torch::Tensor& x) { return p->forward(x); };
  m.train = [p = net.ptr()](bool on) { p->train(on); };
  m.parameters = net->parameters();
  m.state = [net] {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (auto& p : net->named_parameters()) out.emplace_back(p.key(), p.value());
    for (auto& b : net->named_buffers()) {
      if (b.value().scalar_type() == torch::kFloat32) out.emplace_back(b.key(), b.value());
    }
    return out;
  };
  return m;
}

Model FromScript(torch::jit::Module module) {
  Model m;
  m.forward = [module](const torch::Tensor& x) mutable { return module.forward({x}).toTensor(); };
  m.train = [module](bool on) mutable { module.train(on); };
  for (const torch::Tensor& p : module.parameters()) m.parameters.push_back(p);
  m.state = [module] {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& p : module.named_parameters()) out.emplace_back(p.name, p.value);
    for (const auto& b : module.named_buffers()) {
      if (b.value.scalar_type() == torch::kFloat32) out.emplace_back(b.name, b.value);
    }
    return out;
  };
  return m;
}

// --epoch_end_loss's and --next_epoch_loss's loop (see the top).
template <typename Loader>
void TrainAcrossPasses(ddp::Session& session, ddp::DistributedDataParallel& model, Model& m,
                       torch::optim::Optimizer& optimizer, const ddp::DistributedSampler& sampler,
                       Loader& loader, int epochs, bool die_in_next_epoch) {
  const bool dies = session.world_size() == 3 && session.rank() == 2;
  uint64_t generation = session.generation();
  int micro = 0;
  for (int epoch = static_cast<int>(session.start_epoch()); epoch < epochs; ++epoch) {
    torch::Tensor sum = torch::zeros({2});
    size_t batches = 0;
    for (auto& batch : loader) {
      if (die_in_next_epoch && dies && epoch == 1) std::_Exit(3);
      if (session.generation() != generation) {
        generation = session.generation();
        micro = 0;
      }
      if (micro == 0) optimizer.zero_grad();
      torch::Tensor loss = torch::cross_entropy_loss(m.forward(batch.data), batch.target) / 2;
      sum += torch::stack({loss.detach() * 2, torch::ones({})});
      if (++micro < 2) {
        auto local_only = model.no_sync();
        loss.backward();
      } else {
        loss.backward();
        optimizer.step();
        micro = 0;
        session.report_step(loss.item<double>() * 2, batch.target.size(0), epoch);
      }
      const bool last = ++batches == (sampler.size() + kBatch - 1) / kBatch;
      if (!die_in_next_epoch && last && epoch == 0 && session.world_size() == 3 &&
          session.rank() == 1) {
        std::this_thread::sleep_for(std::chrono::seconds(2));
      }
    }
    if (sampler.epoch() != static_cast<uint64_t>(epoch)) {
      std::cout << "the sampler's epoch " << sampler.epoch() << " in the loop's epoch " << epoch
                << std::endl;
    }
    if (!die_in_next_epoch && dies && epoch == 0) std::_Exit(3);
    session.all_reduce_sum(sum);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: ddp_library_parity_trainer DIR "
                 "[--accumulate|--torchscript|--mismatch|--nested_no_sync|--no_param_steps|"
                 "--zero_loss_steps|--extra_barrier|--diverge|--epoch_end_loss|--next_epoch_loss|"
                 "--partial_last_step]\n";
    return 2;
  }
  const std::string dir = argv[1];
  const std::string flag = argc > 2 ? argv[2] : "";
  bool elastic = false;
  int epochs = 2;
  for (int i = 3; i < argc; ++i) {
    const std::string extra = argv[i];
    if (extra == "--elastic") elastic = true;
    if (extra.rfind("--epochs=", 0) == 0) epochs = std::stoi(extra.substr(9));
  }
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
    // --torchscript: the same network scripted in Python (with the same
    // initial weights), loaded as a torch::jit::Module instead.
    const bool scripted = flag == "--torchscript";
    torch::jit::Module script;
    Model m;
    std::unique_ptr<ddp::DistributedDataParallel> ddp;
    if (scripted) {
      script = torch::jit::load(dir + "/net.pt");
      m = FromScript(script);
      ddp = std::make_unique<ddp::DistributedDataParallel>(
          *session, script, ddp::DistributedDataParallel::Options{/*bucket_cap_mb=*/0.001});
    } else {
      m = FromNet(net);
      ddp = std::make_unique<ddp::DistributedDataParallel>(
          *session, net.ptr(), ddp::DistributedDataParallel::Options{/*bucket_cap_mb=*/0.001});
    }
    ddp::DistributedDataParallel& model = *ddp;
    if (flag == "--nested_no_sync") {
      auto outer = model.no_sync();
      auto inner = model.no_sync();  // throws
    }
    FileDataset dataset(dir);
    ddp::DistributedSampler sampler(*dataset.size(), *session, {/*seed=*/7});
    auto loader =
        torch::data::make_data_loader(dataset.map(torch::data::transforms::Stack<>()), sampler,
                                      torch::data::DataLoaderOptions().batch_size(kBatch));
    torch::optim::SGD optimizer(m.parameters, torch::optim::SGDOptions(0.05).momentum(0.9));
    const std::string tag = flag == "--accumulate"        ? "acc-"
                            : scripted                    ? "ts-"
                            : flag == "--no_param_steps"  ? "np-"
                            : flag == "--zero_loss_steps" ? "zl-"
                            : flag == "--extra_barrier"   ? "xb-"
                                                          : "";
    const bool skipper = session->rank() == 1;
    int step = 0;
    if (elastic) {
      ddp::Session::ElasticState state;
      state.optimizer = &optimizer;
      // The program's own extras: its step count, as bytes it reads back.
      state.save = [&step] { return "program step " + std::to_string(step); };
      state.load = [](const std::string& bytes) {
        std::cout << "took up the program's own state: " << bytes << std::endl;
      };
      if (scripted) {
        state.script_module = &script;
      } else {
        state.module = net.ptr();
      }
      session->set_elastic_state(state);
    }
    std::ofstream losses(dir + "/" + tag + "losses-" + std::to_string(session->rank()) + ".txt");
    std::ofstream eval_losses(dir + "/" + tag + "eval-" + std::to_string(session->rank()) + ".txt");
    const torch::Tensor probe_x =
        torch::stack({dataset.get(0).data, dataset.get(1).data, dataset.get(2).data});
    const torch::Tensor probe_y =
        torch::stack({dataset.get(0).target, dataset.get(1).target, dataset.get(2).target});
    const bool across_passes = flag == "--epoch_end_loss" || flag == "--next_epoch_loss";
    const bool partial = flag == "--partial_last_step";
    if (partial) {
      // Every rank's pass has the same number of batches (padded).
      const size_t steps = (sampler.size() + kBatch - 1) / kBatch;
      setenv("DDP_TEST_FAIL_STEP", ("1:" + std::to_string(steps)).c_str(), 1);
    }
    if (across_passes) {
      TrainAcrossPasses(*session, model, m, optimizer, sampler, *loader, epochs,
                        flag == "--next_epoch_loss");
    }
    // Otherwise a step a batch.
    const int batch_step_epochs = across_passes ? 0 : epochs;
    for (int epoch = static_cast<int>(session->start_epoch()); epoch < batch_step_epochs; ++epoch) {
      double pass_loss = 0;
      for (auto& batch : *loader) {
        {
          torch::NoGradGuard no_grad;
          m.train(false);
          char line[64];
          std::snprintf(line, sizeof(line), "%.9g\n",
                        torch::cross_entropy_loss(m.forward(probe_x), probe_y).item<double>());
          eval_losses << line;
          m.train(true);
        }
        optimizer.zero_grad();
        double step_loss = 0;
        ++step;
        if (flag == "--extra_barrier" && skipper && step == 3) session->barrier();
        if (flag == "--diverge" && skipper && step == 50) {
          torch::NoGradGuard no_grad;
          net->aux->bias.add_(1e-3);
        }
        if ((flag == "--no_param_steps" || flag == "--zero_loss_steps") && skipper &&
            step % 3 == 1) {
          // The same forward either way (BatchNorm's statistics move alike).
          torch::Tensor out = m.forward(batch.data);
          torch::Tensor loss =
              flag == "--no_param_steps"
                  ? torch::cross_entropy_loss(out.detach().requires_grad_(), batch.target) * 0
                  : torch::cross_entropy_loss(out, batch.target) * 0;
          loss.backward();
        } else if (flag == "--accumulate") {
          const std::vector<torch::Tensor> x = batch.data.chunk(2), y = batch.target.chunk(2);
          {
            auto local_only = model.no_sync();
            torch::Tensor loss = torch::cross_entropy_loss(m.forward(x[0]), y[0]) / 2;
            loss.backward();
            step_loss += loss.item<double>();
          }
          torch::Tensor loss = torch::cross_entropy_loss(m.forward(x[1]), y[1]) / 2;
          loss.backward();
          step_loss += loss.item<double>();
        } else {
          torch::Tensor loss = torch::cross_entropy_loss(m.forward(batch.data), batch.target);
          loss.backward();
          step_loss = loss.item<double>();
        }
        optimizer.step();
        char line[64];
        std::snprintf(line, sizeof(line), "%.9g\n", step_loss);
        losses << line;
        session->report_step(step_loss, batch.target.size(0), epoch);
        pass_loss += step_loss;
      }
      if (partial) {
        torch::Tensor total = torch::tensor({static_cast<float>(pass_loss)});
        session->all_reduce_sum(total);
        std::cout << "epoch " << epoch << " summed loss " << total.item<float>() << std::endl;
      }
    }
    if (session->rank() == 0) {
      for (auto& [name, value] : m.state()) {
        std::ofstream out(dir + "/" + tag + "final-" + name + ".bin", std::ios::binary);
        torch::Tensor t = value.contiguous();
        out.write(reinterpret_cast<const char*>(t.data_ptr<float>()), t.nbytes());
      }
    }
    session->finish();  // throws unless the job succeeded (with a coordinator)
    std::cout << "rank " << session->rank() << " parameter digest " << Digest(m.parameters) << "\n";
    std::cout << "rank " << session->rank() << " done over " << session->backend()
              << "; last reduction: " << model.last_reduction().buckets << " buckets, "
              << model.last_reduction().globally_unused_parameters << " globally unused\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
