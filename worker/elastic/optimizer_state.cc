#include "worker/elastic/optimizer_state.h"

#include <typeinfo>

#include <torch/optim.h>
#include <torch/types.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace ddp::state_records {
namespace {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

enum class Kind { kNone, kSGD, kAdam, kAdamW, kOther };

Kind KindOf(const torch::optim::Optimizer* optimizer) {
  if (optimizer == nullptr) return Kind::kNone;
  if (dynamic_cast<const torch::optim::SGD*>(optimizer)) return Kind::kSGD;
  // AdamW first: it is not an Adam in LibTorch, but be sure.
  if (dynamic_cast<const torch::optim::AdamW*>(optimizer)) return Kind::kAdamW;
  if (dynamic_cast<const torch::optim::Adam*>(optimizer)) return Kind::kAdam;
  return Kind::kOther;
}

// The optimizer's parameters, over its param_groups() in order, each with
// whether its group has amsgrad set (Adam, AdamW).
struct Param {
  at::Tensor tensor;
  bool amsgrad = false;
};
std::vector<Param> Params(const torch::optim::Optimizer& optimizer, Kind kind) {
  std::vector<Param> out;
  for (const auto& group : optimizer.param_groups()) {
    bool amsgrad = false;
    if (kind == Kind::kAdam) {
      amsgrad = static_cast<const torch::optim::AdamOptions&>(group.options()).amsgrad();
    } else if (kind == Kind::kAdamW) {
      amsgrad = static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad();
    }
    for (const at::Tensor& p : group.params()) out.push_back({p, amsgrad});
  }
  return out;
}

// LibTorch 1.13's optimizers key their state by this (sgd.cpp, adam.cpp,
// and optim/serialize.h's load).
std::string StateKey(const at::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

const torch::optim::OptimizerParamState* FindState(const torch::optim::Optimizer& optimizer,
                                                   const at::Tensor& p) {
  auto it = optimizer.state().find(StateKey(p));
  return it == optimizer.state().end() ? nullptr : it->second.get();
}

// Adam's or AdamW's moments (three with amsgrad), and its step.
template <typename State>
absl::Status CaptureAdam(const torch::optim::OptimizerParamState* state, const Param& p,
                         OptimizerEntry* entry) {
  const auto* adam = static_cast<const State*>(state);
  if (adam == nullptr) return absl::OkStatus();
  if (!adam->exp_avg().defined() || !adam->exp_avg_sq().defined()) {
    return absl::InternalError("can't encode the training state: Adam state without moments");
  }
  if (adam->max_exp_avg_sq().defined() && !p.amsgrad) {
    return absl::InternalError(
        "can't encode the training state: Adam state with max_exp_avg_sq but no amsgrad");
  }
  entry->present = true;
  entry->step = adam->step();
  entry->amsgrad = adam->max_exp_avg_sq().defined();
  for (auto [field, t] : {std::pair<const char*, const at::Tensor*>{"exp_avg", &adam->exp_avg()},
                          {"exp_avg_sq", &adam->exp_avg_sq()},
                          {"max_exp_avg_sq", &adam->max_exp_avg_sq()}}) {
    if (!t->defined()) continue;
    absl::StatusOr<Record> r = MakeRecord(field, *t);
    if (!r.ok()) return r.status();
    entry->records.push_back(std::move(*r));
  }
  return absl::OkStatus();
}

// An optimizer-state record: named `field`, of `param`'s shape and dtype,
// placed on `param`'s device.
absl::Status ReadStateTensor(Reader& r, const std::string& param_name, const at::Tensor& param,
                             absl::string_view field, at::Tensor* out) {
  const std::string what = absl::StrCat("the optimizer's ", field, " of \"", param_name, "\"");
  RecordHead head;
  if (absl::Status s = ReadHead(r, what, &head); !s.ok()) return s;
  if (head.name != field) {
    return absl::DataLossError(absl::StrCat("training state corrupt: ", what, " is named \"",
                                            absl::CHexEscape(head.name), "\""));
  }
  if (!head.Matches(param)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " is ", Describe(head.sizes, head.dtype), " in the training state, but ",
                     Describe(param),
                     " is the parameter's own; the state was saved by another "
                     "model or optimizer"));
  }
  if (absl::Status s = ReadData(r, param, what, out); !s.ok()) return s;
  *out = out->to(param.device());
  return absl::OkStatus();
}

template <typename State>
absl::StatusOr<std::unique_ptr<torch::optim::OptimizerParamState>> ReadAdam(Reader& r,
                                                                            const std::string& name,
                                                                            const Param& mine) {
  uint64_t step = 0;
  bool amsgrad = false;
  if (absl::Status s = r.Le(8, "an Adam step count", &step); !s.ok()) return s;
  if (absl::Status s = r.Flag("an Adam amsgrad flag", &amsgrad); !s.ok()) return s;
  if (static_cast<int64_t>(step) < 0) {
    return absl::DataLossError(absl::StrCat("training state corrupt: \"", name,
                                            "\"'s Adam step count is ",
                                            static_cast<int64_t>(step)));
  }
  if (amsgrad != mine.amsgrad) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the training state's Adam state of \"", name, "\" was saved with amsgrad ",
        amsgrad ? "on" : "off", " but this rank's optimizer has it ", mine.amsgrad ? "on" : "off"));
  }
  auto state = std::make_unique<State>();
  state->step(static_cast<int64_t>(step));
  at::Tensor t;
  if (absl::Status s = ReadStateTensor(r, name, mine.tensor, "exp_avg", &t); !s.ok()) return s;
  state->exp_avg(std::move(t));
  if (absl::Status s = ReadStateTensor(r, name, mine.tensor, "exp_avg_sq", &t); !s.ok()) return s;
  state->exp_avg_sq(std::move(t));
  if (amsgrad) {
    if (absl::Status s = ReadStateTensor(r, name, mine.tensor, "max_exp_avg_sq", &t); !s.ok()) {
      return s;
    }
    state->max_exp_avg_sq(std::move(t));
  }
  return state;
}

absl::StatusOr<std::unique_ptr<torch::optim::OptimizerParamState>> ReadSgd(Reader& r,
                                                                           const std::string& name,
                                                                           const Param& mine) {
  at::Tensor momentum;
  if (absl::Status s = ReadStateTensor(r, name, mine.tensor, "momentum_buffer", &momentum);
      !s.ok()) {
    return s;
  }
  auto state = std::make_unique<torch::optim::SGDParamState>();
  state->momentum_buffer(std::move(momentum));
  return state;
}

// The optimizer must be over the model's parameters, in order.
absl::Status CheckOverModel(const std::vector<Param>& mine, const NamedTensors& params) {
  if (mine.size() != params.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this rank's optimizer is over ", mine.size(), " parameters but its model has ",
        params.size(), "; the optimizer must be built over all of the model's parameters"));
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    if (mine[i].tensor.sizes() != params[i].second.sizes() ||
        mine[i].tensor.scalar_type() != params[i].second.scalar_type()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this rank's optimizer's parameter ", i, " is ", Describe(mine[i].tensor),
          " but the model's, \"", params[i].first, "\", is ", Describe(params[i].second),
          "; the optimizer must be built over the model's parameters in order"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string KindName(const torch::optim::Optimizer* optimizer) {
  switch (KindOf(optimizer)) {
    case Kind::kNone:
      return "none";
    case Kind::kSGD:
      return "SGD";
    case Kind::kAdam:
      return "Adam";
    case Kind::kAdamW:
      return "AdamW";
    case Kind::kOther:
      break;
  }
  if (dynamic_cast<const torch::optim::Adagrad*>(optimizer)) return "Adagrad";
  if (dynamic_cast<const torch::optim::RMSprop*>(optimizer)) return "RMSprop";
  if (dynamic_cast<const torch::optim::LBFGS*>(optimizer)) return "LBFGS";
  return typeid(*optimizer).name();
}

absl::Status CheckOptimizerCarried(const torch::optim::Optimizer* optimizer) {
  if (KindOf(optimizer) != Kind::kOther) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("this rank's optimizer is ", KindName(optimizer),
                   "; a training state carries SGD, Adam or AdamW optimizer state only"));
}

absl::StatusOr<CapturedOptimizer> CaptureOptimizer(const torch::optim::Optimizer* optimizer) {
  if (absl::Status s = CheckOptimizerCarried(optimizer); !s.ok()) return s;
  const Kind kind = KindOf(optimizer);
  CapturedOptimizer out{KindName(optimizer), {}};
  if (kind == Kind::kNone) return out;
  for (const Param& p : Params(*optimizer, kind)) {
    OptimizerEntry& entry = out.entries.emplace_back();
    const torch::optim::OptimizerParamState* state = FindState(*optimizer, p.tensor);
    absl::Status s = absl::OkStatus();
    if (kind == Kind::kAdam) s = CaptureAdam<torch::optim::AdamParamState>(state, p, &entry);
    if (kind == Kind::kAdamW) s = CaptureAdam<torch::optim::AdamWParamState>(state, p, &entry);
    if (!s.ok()) return s;
    if (kind != Kind::kSGD) continue;
    const auto* sgd = static_cast<const torch::optim::SGDParamState*>(state);
    if (sgd == nullptr || !sgd->momentum_buffer().defined()) continue;
    absl::StatusOr<Record> r = MakeRecord("momentum_buffer", sgd->momentum_buffer());
    if (!r.ok()) return r.status();
    entry.present = true;
    entry.records.push_back(std::move(*r));
  }
  return out;
}

size_t OptimizerSize(const CapturedOptimizer& captured) {
  size_t size = 4 + captured.kind.size() + 8;
  for (const OptimizerEntry& e : captured.entries) {
    size += 1 + 9;  // flag, Adam's step and amsgrad flag
    for (const Record& r : e.records) size += RecordSize(r);
  }
  return size;
}

void PutOptimizer(std::string* out, const CapturedOptimizer& captured) {
  PutString(out, captured.kind);
  PutU64(out, captured.entries.size());
  const bool adam = captured.kind == "Adam" || captured.kind == "AdamW";
  for (const OptimizerEntry& e : captured.entries) {
    out->push_back(e.present ? 1 : 0);
    if (!e.present) continue;
    if (adam) {
      PutU64(out, static_cast<uint64_t>(e.step));
      out->push_back(e.amsgrad ? 1 : 0);
    }
    for (const Record& r : e.records) PutRecord(out, r);
  }
}

absl::Status ReadOptimizer(Reader& r, const NamedTensors& params,
                           const torch::optim::Optimizer* optimizer, ParamStates* staged) {
  absl::string_view kind;
  if (absl::Status s = r.String("the optimizer's kind", &kind); !s.ok()) return s;
  if (kind != "none" && kind != "SGD" && kind != "Adam" && kind != "AdamW") {
    return absl::DataLossError(
        absl::StrCat("training state corrupt: optimizer kind \"", absl::CHexEscape(kind), "\""));
  }
  if (absl::Status s = CheckOptimizerCarried(optimizer); !s.ok()) return s;
  if (kind != KindName(optimizer)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the training state holds ", kind, " optimizer state but this rank's optimizer is ",
        KindName(optimizer), "; the optimizer must match the one that saved it"));
  }
  const Kind my_kind = KindOf(optimizer);
  std::vector<Param> mine;
  if (my_kind != Kind::kNone) {
    mine = Params(*optimizer, my_kind);
    if (absl::Status s = CheckOverModel(mine, params); !s.ok()) return s;
  }
  uint64_t count = 0;
  if (absl::Status s = r.Le(8, "the optimizer's parameter count", &count); !s.ok()) return s;
  if (count != mine.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the training state holds optimizer state for ", count,
                     " parameters but this rank's optimizer is over ", mine.size()));
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    const std::string& name = params[i].first;
    bool present = false;
    if (absl::Status s =
            r.Flag(absl::StrCat("the optimizer's state flag of \"", name, "\""), &present);
        !s.ok()) {
      return s;
    }
    if (!present) {
      staged->push_back(nullptr);
      continue;
    }
    absl::StatusOr<std::unique_ptr<torch::optim::OptimizerParamState>> state =
        my_kind == Kind::kSGD    ? ReadSgd(r, name, mine[i])
        : my_kind == Kind::kAdam ? ReadAdam<torch::optim::AdamParamState>(r, name, mine[i])
                                 : ReadAdam<torch::optim::AdamWParamState>(r, name, mine[i]);
    if (!state.ok()) return state.status();
    staged->push_back(std::move(*state));
  }
  return absl::OkStatus();
}

StateMap KeyedStates(const torch::optim::Optimizer& optimizer, ParamStates staged) {
  StateMap map;
  const std::vector<Param> mine = Params(optimizer, KindOf(&optimizer));
  for (size_t i = 0; i < mine.size() && i < staged.size(); ++i) {
    if (staged[i] != nullptr) map[StateKey(mine[i].tensor)] = std::move(staged[i]);
  }
  return map;
}

}  // namespace ddp::state_records
