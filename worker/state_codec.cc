#include "worker/state_codec.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <memory>
#include <mutex>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "worker/digest.h"
#include "worker/torch_error.h"

namespace ddp {
namespace {

// Elements travel in the host's byte order, which the layout fixes as
// little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the state layout is little-endian");

constexpr absl::string_view kMagic = "DDPSTATE";
// Where the header starts: after the magic, version and header length.
constexpr size_t kHeaderAt = 8 + 4 + 8;
// magic, version, header length, payload length, CRC.
constexpr size_t kFramingBytes = kHeaderAt + 8 + 4;
// LibTorch's own limit on a tensor's dimensions.
constexpr uint8_t kMaxDims = 64;

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetLe(absl::string_view bytes, size_t at, int width) {
  uint64_t v = 0;
  for (int i = 0; i < width; ++i) {
    v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  }
  return v;
}

uint32_t Crc32(absl::string_view data) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (!data.empty()) {
    const size_t n = std::min<size_t>(data.size(), 1u << 30);  // zlib takes a uInt length
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(n));
    data.remove_prefix(n);
  }
  return static_cast<uint32_t>(crc);
}

struct Framed {
  v1::TrainingStateHeader header;
  absl::string_view payload;
};

absl::Status Truncated(size_t have, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("training state truncated: ", have, " bytes end before ",
                                          what, " (an interrupted write or transfer)"));
}

absl::StatusOr<Framed> ParseFraming(absl::string_view bytes) {
  const size_t size = bytes.size();
  if (size < kMagic.size() || bytes.substr(0, kMagic.size()) != kMagic) {
    if (size < kMagic.size() && kMagic.substr(0, size) == bytes) {
      return Truncated(size, "its magic");
    }
    return absl::DataLossError(
        absl::StrCat("not a training state: it starts with \"",
                     absl::CHexEscape(bytes.substr(0, std::min(size, kMagic.size()))), "\", not \"",
                     kMagic, "\""));
  }
  if (size < kHeaderAt) return Truncated(size, "the layout version and header length");
  const uint32_t version = static_cast<uint32_t>(GetLe(bytes, 8, 4));
  if (version != kStateFormatVersion) {
    return absl::DataLossError(absl::StrCat("training state has layout version ", version,
                                            "; this worker reads version ", kStateFormatVersion,
                                            ": resume with the version that wrote it"));
  }
  const uint64_t header_len = GetLe(bytes, 12, 8);
  if (header_len > size - kHeaderAt) {
    return Truncated(size, absl::StrCat("its ", header_len, "-byte header"));
  }
  size_t pos = kHeaderAt + header_len;
  if (size - pos < 8) return Truncated(size, "the payload length");
  const uint64_t payload_len = GetLe(bytes, pos, 8);
  pos += 8;
  if (payload_len > size - pos || size - pos - payload_len < 4) {
    return Truncated(
        size, absl::StrCat("the ", payload_len, "-byte payload and CRC its header promises (",
                           kFramingBytes + header_len + payload_len, " bytes in all)"));
  }
  if (size - pos - payload_len > 4) {
    return absl::DataLossError(
        absl::StrCat("training state corrupt: ", size - pos - payload_len - 4,
                     " unexpected bytes after the CRC"));
  }
  const uint32_t stored = static_cast<uint32_t>(GetLe(bytes, size - 4, 4));
  const uint32_t computed = Crc32(bytes.substr(0, size - 4));
  if (stored != computed) {
    return absl::DataLossError(absl::StrFormat(
        "training state corrupt: the CRC-32 of its %d bytes is %08x, it says %08x (damaged on "
        "disk or in transit)",
        size - 4, computed, stored));
  }
  Framed framed;
  if (!framed.header.ParseFromArray(bytes.data() + kHeaderAt, static_cast<int>(header_len))) {
    return absl::DataLossError("training state corrupt: its header is not a TrainingStateHeader");
  }
  framed.payload = bytes.substr(pos, payload_len);
  return framed;
}

// The layout's own dtype codes, fixed here rather than borrowed from
// c10::ScalarType's numbering, which is LibTorch's to change.
constexpr c10::ScalarType kDtypes[] = {
    c10::ScalarType::Byte,     c10::ScalarType::Char,         c10::ScalarType::Short,
    c10::ScalarType::Int,      c10::ScalarType::Long,         c10::ScalarType::Half,
    c10::ScalarType::Float,    c10::ScalarType::Double,       c10::ScalarType::Bool,
    c10::ScalarType::BFloat16, c10::ScalarType::ComplexFloat, c10::ScalarType::ComplexDouble};

absl::StatusOr<uint8_t> DtypeCode(c10::ScalarType dtype) {
  for (size_t i = 0; i < std::size(kDtypes); ++i) {
    if (kDtypes[i] == dtype) return static_cast<uint8_t>(i);
  }
  return absl::InternalError(absl::StrCat(
      "can't encode the training state: the layout has no code for dtype ", c10::toString(dtype)));
}

std::string KindName(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return "SGD";
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return "AdamW";
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return "Adam";
  if (dynamic_cast<const torch::optim::Adagrad*>(&optimizer)) return "Adagrad";
  if (dynamic_cast<const torch::optim::RMSprop*>(&optimizer)) return "RMSprop";
  if (dynamic_cast<const torch::optim::LBFGS*>(&optimizer)) return "LBFGS";
  return typeid(optimizer).name();
}

// The kinds whose state the layout carries.
enum class OptimizerKind { kSGD, kAdam, kOther };

OptimizerKind KindOf(const torch::optim::Optimizer& optimizer) {
  const std::string name = KindName(optimizer);
  if (name == "SGD") return OptimizerKind::kSGD;
  if (name == "Adam") return OptimizerKind::kAdam;
  return OptimizerKind::kOther;
}

absl::Status UnsupportedOptimizer(const torch::optim::Optimizer& optimizer) {
  return absl::FailedPreconditionError(
      absl::StrCat("this worker's optimizer is ", KindName(optimizer),
                   "; a training state carries SGD or Adam optimizer state only"));
}

// The optimizer's parameters, over its param_groups() in order, each with
// whether its group has amsgrad set (Adam).
struct OptimizerParam {
  at::Tensor tensor;
  bool amsgrad = false;
};
std::vector<OptimizerParam> OptimizerParams(const torch::optim::Optimizer& optimizer,
                                            OptimizerKind kind) {
  std::vector<OptimizerParam> out;
  for (const auto& group : optimizer.param_groups()) {
    const bool amsgrad = kind == OptimizerKind::kAdam &&
                         static_cast<const torch::optim::AdamOptions&>(group.options()).amsgrad();
    for (const at::Tensor& p : group.params()) out.push_back({p, amsgrad});
  }
  return out;
}

// LibTorch 1.13's SGD and Adam key their state by this (sgd.cpp, adam.cpp,
// and optim/serialize.h's load).
std::string StateKey(const at::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

const torch::optim::OptimizerParamState* FindState(const torch::optim::Optimizer& optimizer,
                                                   const at::Tensor& p) {
  auto it = optimizer.state().find(StateKey(p));
  return it == optimizer.state().end() ? nullptr : it->second.get();
}

at::Tensor GetRngState() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void SetRngState(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

std::string Describe(c10::IntArrayRef sizes, c10::ScalarType dtype) {
  return absl::StrCat("[", absl::StrJoin(sizes, ", "), "] ", c10::toString(dtype));
}
std::string Describe(const at::Tensor& t) { return Describe(t.sizes(), t.scalar_type()); }

// ---- Writing ----

// The tensors to write, each on the CPU and contiguous, so that its bytes
// can be appended as they lie.
struct Record {
  std::string name;
  at::Tensor tensor;
};

absl::StatusOr<Record> MakeRecord(std::string name, const at::Tensor& t) {
  absl::StatusOr<uint8_t> code = DtypeCode(t.scalar_type());
  if (!code.ok()) return code.status();
  if (t.dim() > kMaxDims) {
    return absl::InternalError(absl::StrCat("can't encode the training state: \"", name, "\" has ",
                                            t.dim(), " dimensions"));
  }
  return Record{std::move(name), t.detach().to(torch::kCPU).contiguous()};
}

void PutString(std::string* out, absl::string_view s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s.data(), s.size());
}

void PutRecord(std::string* out, const Record& r) {
  PutString(out, r.name);
  out->push_back(static_cast<char>(*DtypeCode(r.tensor.scalar_type())));
  out->push_back(static_cast<char>(r.tensor.dim()));
  for (int64_t size : r.tensor.sizes()) PutU64(out, static_cast<uint64_t>(size));
  out->append(static_cast<const char*>(r.tensor.data_ptr()), r.tensor.nbytes());
}

// ---- Reading ----

// Reads the payload front to back. Every read checks what is left first;
// a failed read is DATA_LOSS, "truncated".
class Reader {
 public:
  explicit Reader(absl::string_view payload) : payload_(payload) {}

  size_t left() const { return payload_.size() - at_; }

  absl::Status Bytes(size_t n, absl::string_view what, absl::string_view* out) {
    if (n > left()) {
      return absl::DataLossError(absl::StrCat("training state truncated: its payload has ", left(),
                                              " bytes left at offset ", at_, ", fewer than the ", n,
                                              " of ", what));
    }
    *out = payload_.substr(at_, n);
    at_ += n;
    return absl::OkStatus();
  }
  absl::Status Le(int width, absl::string_view what, uint64_t* out) {
    absl::string_view b;
    if (absl::Status s = Bytes(width, what, &b); !s.ok()) return s;
    *out = GetLe(b, 0, width);
    return absl::OkStatus();
  }
  absl::Status String(absl::string_view what, absl::string_view* out) {
    uint64_t n = 0;
    if (absl::Status s = Le(4, what, &n); !s.ok()) return s;
    return Bytes(n, what, out);
  }
  absl::Status Flag(absl::string_view what, bool* out) {
    uint64_t v = 0;
    if (absl::Status s = Le(1, what, &v); !s.ok()) return s;
    if (v > 1) {
      return absl::DataLossError(
          absl::StrCat("training state corrupt: ", what, " is ", v, ", not 0 or 1"));
    }
    *out = v == 1;
    return absl::OkStatus();
  }

 private:
  absl::string_view payload_;
  size_t at_ = 0;
};

// A record's name, dtype and sizes, before its data.
struct RecordHead {
  absl::string_view name;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<int64_t> sizes;  // at most kMaxDims

  bool Matches(const at::Tensor& t) const {
    return dtype == t.scalar_type() && c10::IntArrayRef(sizes) == t.sizes();
  }
};

absl::Status ReadHead(Reader& r, absl::string_view what, RecordHead* head) {
  if (absl::Status s = r.String(absl::StrCat(what, "'s name"), &head->name); !s.ok()) return s;
  uint64_t code = 0;
  uint64_t dims = 0;
  if (absl::Status s = r.Le(1, absl::StrCat(what, "'s dtype"), &code); !s.ok()) return s;
  if (absl::Status s = r.Le(1, absl::StrCat(what, "'s dimensions"), &dims); !s.ok()) return s;
  if (code >= std::size(kDtypes)) {
    return absl::DataLossError(
        absl::StrCat("training state corrupt: ", what, " has unknown dtype code ", code));
  }
  if (dims > kMaxDims) {
    return absl::DataLossError(
        absl::StrCat("training state corrupt: ", what, " has ", dims, " dimensions"));
  }
  head->dtype = kDtypes[code];
  head->sizes.clear();
  for (uint64_t i = 0; i < dims; ++i) {
    uint64_t size = 0;
    if (absl::Status s = r.Le(8, absl::StrCat(what, "'s sizes"), &size); !s.ok()) return s;
    head->sizes.push_back(static_cast<int64_t>(size));  // compared, never used to allocate
  }
  return absl::OkStatus();
}

// The data of a record whose head matched `like` (this rank's own tensor):
// its length is like's, whatever the bytes say, and it is copied into a
// new CPU tensor of like's shape and dtype.
absl::Status ReadData(Reader& r, const at::Tensor& like, absl::string_view what, at::Tensor* out) {
  absl::string_view data;
  const size_t nbytes = static_cast<size_t>(like.numel()) * like.element_size();
  if (absl::Status s = r.Bytes(nbytes, absl::StrCat(what, "'s elements"), &data); !s.ok()) {
    return s;
  }
  if (like.scalar_type() == c10::ScalarType::Bool &&
      std::any_of(data.begin(), data.end(), [](char c) { return c != 0 && c != 1; })) {
    return absl::DataLossError(
        absl::StrCat("training state corrupt: ", what, " holds a bool that is not 0 or 1"));
  }
  *out = torch::empty(like.sizes(), torch::TensorOptions().dtype(like.scalar_type()));
  if (nbytes > 0) std::memcpy(out->data_ptr(), data.data(), nbytes);
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

// Reads a tensors section into `out`, in the model's order, checking names,
// order, shapes and dtypes against `mine` before any data.
absl::Status ReadTensors(Reader& r, absl::string_view noun, const std::vector<NamedTensor>& mine,
                         std::vector<at::Tensor>* out) {
  uint64_t count = 0;
  if (absl::Status s = r.Le(8, absl::StrCat("the number of ", noun, "s"), &count); !s.ok()) {
    return s;
  }
  // `count` only bounds the loop together with mine.size(): nothing is
  // sized by it.
  for (uint64_t i = 0; i < count || i < mine.size(); ++i) {
    if (i >= count) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the training state has ", count, " ", noun, "s, this model ", mine.size(),
          ": the state lacks ", noun, " \"", mine[i].first, "\"; it was saved by another model"));
    }
    RecordHead head;
    if (absl::Status s = ReadHead(r, absl::StrCat(noun, " ", i), &head); !s.ok()) return s;
    const std::string theirs = absl::CHexEscape(head.name);
    if (i >= mine.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the training state has ", count, " ", noun, "s, this model ", mine.size(), ": it lacks ",
          noun, " \"", theirs, "\"; the state was saved by another model"));
    }
    if (head.name != mine[i].first) {
      return absl::FailedPreconditionError(
          absl::StrCat(noun, " ", i, " is \"", mine[i].first, "\" in this model but \"", theirs,
                       "\" in the training state; the state was saved by another model"));
    }
    const at::Tensor& m = mine[i].second;
    if (!head.Matches(m)) {
      return absl::FailedPreconditionError(
          absl::StrCat(noun, " \"", theirs, "\" is ", Describe(m), " in this model but ",
                       Describe(head.sizes, head.dtype),
                       " in the training state; the state was saved by another model"));
    }
    at::Tensor t;
    if (absl::Status s = ReadData(r, m, absl::StrCat(noun, " \"", theirs, "\""), &t); !s.ok()) {
      return s;
    }
    out->push_back(std::move(t));
  }
  return absl::OkStatus();
}

// Everything read and checked, nothing applied yet.
struct Staged {
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> buffers;
  // Per optimizer parameter, in param_groups() order; null: no state yet.
  std::vector<std::unique_ptr<torch::optim::OptimizerParamState>> optimizer;
  at::Tensor rng;
};

absl::Status ReadOptimizer(Reader& r, const std::vector<NamedTensor>& params,
                           const torch::optim::Optimizer& optimizer, Staged* staged) {
  absl::string_view kind;
  if (absl::Status s = r.String("the optimizer's kind", &kind); !s.ok()) return s;
  const OptimizerKind my_kind = KindOf(optimizer);
  if (kind != "SGD" && kind != "Adam") {
    return absl::DataLossError(
        absl::StrCat("training state corrupt: optimizer kind \"", absl::CHexEscape(kind), "\""));
  }
  if (kind != KindName(optimizer)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the training state holds ", kind,
        " optimizer state but this worker's "
        "optimizer is ",
        KindName(optimizer), "; the job's optimizer must match the one that saved it"));
  }
  const std::vector<OptimizerParam> mine = OptimizerParams(optimizer, my_kind);
  if (mine.size() != params.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this worker's optimizer is over ", mine.size(), " parameters but its model has ",
        params.size(), "; the optimizer must be built over all of Model::Parameters()"));
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    if (mine[i].tensor.sizes() != params[i].second.sizes() ||
        mine[i].tensor.scalar_type() != params[i].second.scalar_type()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this worker's optimizer's parameter ", i, " is ", Describe(mine[i].tensor),
          " but the model's, \"", params[i].first, "\", is ", Describe(params[i].second),
          "; the optimizer must be built over Model::Parameters() in order"));
    }
  }
  uint64_t count = 0;
  if (absl::Status s = r.Le(8, "the optimizer's parameter count", &count); !s.ok()) return s;
  if (count != mine.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the training state holds optimizer state for ", count,
                     " parameters but this worker's optimizer is over ", mine.size()));
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    const std::string& name = params[i].first;
    const at::Tensor& p = mine[i].tensor;
    bool present = false;
    if (absl::Status s =
            r.Flag(absl::StrCat("the optimizer's state flag of \"", name, "\""), &present);
        !s.ok()) {
      return s;
    }
    if (!present) {
      staged->optimizer.push_back(nullptr);
      continue;
    }
    if (my_kind == OptimizerKind::kSGD) {
      at::Tensor momentum;
      if (absl::Status s = ReadStateTensor(r, name, p, "momentum_buffer", &momentum); !s.ok()) {
        return s;
      }
      auto state = std::make_unique<torch::optim::SGDParamState>();
      state->momentum_buffer(std::move(momentum));
      staged->optimizer.push_back(std::move(state));
      continue;
    }
    uint64_t step = 0;
    bool amsgrad = false;
    if (absl::Status s = r.Le(8, "an Adam step count", &step); !s.ok()) return s;
    if (absl::Status s = r.Flag("an Adam amsgrad flag", &amsgrad); !s.ok()) return s;
    if (static_cast<int64_t>(step) < 0) {
      return absl::DataLossError(absl::StrCat("training state corrupt: \"", name,
                                              "\"'s Adam step count is ",
                                              static_cast<int64_t>(step)));
    }
    if (amsgrad != mine[i].amsgrad) {
      return absl::FailedPreconditionError(
          absl::StrCat("the training state's Adam state of \"", name, "\" was saved with amsgrad ",
                       amsgrad ? "on" : "off", " but this worker's optimizer has it ",
                       mine[i].amsgrad ? "on" : "off"));
    }
    auto state = std::make_unique<torch::optim::AdamParamState>();
    state->step(static_cast<int64_t>(step));
    at::Tensor t;
    if (absl::Status s = ReadStateTensor(r, name, p, "exp_avg", &t); !s.ok()) return s;
    state->exp_avg(std::move(t));
    if (absl::Status s = ReadStateTensor(r, name, p, "exp_avg_sq", &t); !s.ok()) return s;
    state->exp_avg_sq(std::move(t));
    if (amsgrad) {
      if (absl::Status s = ReadStateTensor(r, name, p, "max_exp_avg_sq", &t); !s.ok()) return s;
      state->max_exp_avg_sq(std::move(t));
    }
    staged->optimizer.push_back(std::move(state));
  }
  return absl::OkStatus();
}

absl::Status Stage(const Framed& framed, const std::vector<NamedTensor>& params,
                   const std::vector<NamedTensor>& buffers,
                   const torch::optim::Optimizer& optimizer, Staged* staged) {
  if (KindOf(optimizer) == OptimizerKind::kOther) return UnsupportedOptimizer(optimizer);
  Reader r(framed.payload);
  if (absl::Status s = ReadTensors(r, "parameter", params, &staged->params); !s.ok()) return s;
  if (absl::Status s = ReadTensors(r, "buffer", buffers, &staged->buffers); !s.ok()) return s;
  if (absl::Status s = ReadOptimizer(r, params, optimizer, staged); !s.ok()) return s;
  if (r.left() != 0) {
    return absl::DataLossError(absl::StrCat("training state corrupt: ", r.left(),
                                            " unexpected bytes after its optimizer state"));
  }
  const std::string digest = TensorDigest(staged->params);
  if (digest != framed.header.parameter_digest()) {
    return absl::DataLossError(absl::StrCat("training state corrupt: its parameters' digest is ",
                                            digest, ", its header says ",
                                            framed.header.parameter_digest()));
  }
  const std::string& rng = framed.header.rng_state();
  const int64_t rng_size = GetRngState().numel();
  if (static_cast<int64_t>(rng.size()) != rng_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("the training state's RNG state is ", rng.size(),
                     " bytes; this LibTorch's CPU generator takes ", rng_size));
  }
  staged->rng = torch::empty({rng_size}, torch::kUInt8);
  std::memcpy(staged->rng.data_ptr(), rng.data(), rng.size());
  return absl::OkStatus();
}

// Per optimizer parameter, its state's records: none (no state yet), SGD's
// momentum_buffer, or Adam's moments (three with amsgrad).
absl::Status EncodeOptimizer(const torch::optim::Optimizer& optimizer,
                             const std::vector<OptimizerParam>& params,
                             std::vector<std::vector<Record>>* records) {
  const OptimizerKind kind = KindOf(optimizer);
  for (const OptimizerParam& p : params) {
    std::vector<Record>& mine = records->emplace_back();
    const torch::optim::OptimizerParamState* state = FindState(optimizer, p.tensor);
    if (kind == OptimizerKind::kSGD) {
      const auto* sgd = static_cast<const torch::optim::SGDParamState*>(state);
      if (sgd == nullptr || !sgd->momentum_buffer().defined()) continue;
      absl::StatusOr<Record> r = MakeRecord("momentum_buffer", sgd->momentum_buffer());
      if (!r.ok()) return r.status();
      mine.push_back(std::move(*r));
      continue;
    }
    const auto* adam = static_cast<const torch::optim::AdamParamState*>(state);
    if (adam == nullptr) continue;
    if (!adam->exp_avg().defined() || !adam->exp_avg_sq().defined()) {
      return absl::InternalError("can't encode the training state: Adam state without moments");
    }
    for (auto [field, t] : {std::pair<const char*, const at::Tensor*>{"exp_avg", &adam->exp_avg()},
                            {"exp_avg_sq", &adam->exp_avg_sq()},
                            {"max_exp_avg_sq", &adam->max_exp_avg_sq()}}) {
      if (!t->defined()) continue;
      absl::StatusOr<Record> r = MakeRecord(field, *t);
      if (!r.ok()) return r.status();
      mine.push_back(std::move(*r));
    }
    if (mine.size() == 3 && !p.amsgrad) {
      return absl::InternalError(
          "can't encode the training state: Adam state with max_exp_avg_sq but no amsgrad");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckStateIdentity(const v1::TrainingStateHeader& header,
                                const StateIdentity& expected) {
  if (header.job_id() == expected.job_id && header.spec_digest() == expected.spec_digest) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "the training state belongs to job \"%s\" (spec digest %s), not to job \"%s\" (spec "
      "digest %s): resume from this job's own state or checkpoint folder",
      header.job_id(), header.spec_digest(), expected.job_id, expected.spec_digest));
}

absl::StatusOr<std::string> EncodeTrainingState(v1::TrainingStateHeader header, Model& model,
                                                torch::optim::Optimizer& optimizer) {
  const OptimizerKind kind = KindOf(optimizer);
  if (kind == OptimizerKind::kOther) return UnsupportedOptimizer(optimizer);
  try {
    const at::Tensor rng = GetRngState();
    header.set_format_version(kStateFormatVersion);
    header.set_rng_state(std::string(static_cast<const char*>(rng.data_ptr()), rng.nbytes()));
    header.set_parameter_digest(ParameterDigest(model));

    // Everything on the CPU first, so that the size is known and the string
    // grows once.
    auto records =
        [](const std::vector<NamedTensor>& tensors) -> absl::StatusOr<std::vector<Record>> {
      std::vector<Record> out;
      for (const auto& [name, t] : tensors) {
        absl::StatusOr<Record> r = MakeRecord(name, t);
        if (!r.ok()) return r.status();
        out.push_back(std::move(*r));
      }
      return out;
    };
    absl::StatusOr<std::vector<Record>> params = records(model.Parameters());
    if (!params.ok()) return params.status();
    absl::StatusOr<std::vector<Record>> buffers = records(model.Buffers());
    if (!buffers.ok()) return buffers.status();
    const std::vector<OptimizerParam> opt_params = OptimizerParams(optimizer, kind);
    std::vector<std::vector<Record>> opt_records;
    if (absl::Status s = EncodeOptimizer(optimizer, opt_params, &opt_records); !s.ok()) {
      return s;
    }
    size_t payload_size = 0;
    auto count = [&payload_size](const Record& r) {
      payload_size += 4 + r.name.size() + 2 + 8 * r.tensor.dim() + r.tensor.nbytes();
    };
    std::for_each(params->begin(), params->end(), count);
    std::for_each(buffers->begin(), buffers->end(), count);
    for (const auto& state : opt_records) {
      payload_size += 1 + 9;  // flag, Adam's step and amsgrad flag
      std::for_each(state.begin(), state.end(), count);
    }
    payload_size += 8 + 8 + 4 + 4 + 8;  // the counts and the kind

    const std::string header_bytes = header.SerializeAsString();
    std::string out;
    out.reserve(kFramingBytes + header_bytes.size() + payload_size);
    out.append(kMagic.data(), kMagic.size());
    PutU32(&out, kStateFormatVersion);
    PutU64(&out, header_bytes.size());
    out += header_bytes;
    const size_t length_at = out.size();
    PutU64(&out, 0);  // the payload's length, once known
    for (const std::vector<Record>* list : {&*params, &*buffers}) {
      PutU64(&out, list->size());
      for (const Record& r : *list) PutRecord(&out, r);
    }
    PutString(&out, kind == OptimizerKind::kSGD ? "SGD" : "Adam");
    PutU64(&out, opt_params.size());
    for (size_t i = 0; i < opt_params.size(); ++i) {
      const std::vector<Record>& records = opt_records[i];
      out.push_back(records.empty() ? 0 : 1);
      if (records.empty()) continue;
      if (kind == OptimizerKind::kAdam) {
        const auto* adam = static_cast<const torch::optim::AdamParamState*>(
            FindState(optimizer, opt_params[i].tensor));
        PutU64(&out, static_cast<uint64_t>(adam->step()));
        out.push_back(records.size() == 3 ? 1 : 0);
      }
      for (const Record& r : records) PutRecord(&out, r);
    }
    std::string length;
    PutU64(&length, out.size() - length_at - 8);
    out.replace(length_at, 8, length);
    PutU32(&out, Crc32(out));
    return out;
  } catch (const std::exception& e) {
    return TorchErrorStatus(absl::StatusCode::kInternal, "can't encode the training state", e);
  }
}

absl::StatusOr<v1::TrainingStateHeader> ReadTrainingStateHeader(absl::string_view bytes) {
  absl::StatusOr<Framed> framed = ParseFraming(bytes);
  if (!framed.ok()) return framed.status();
  return std::move(framed->header);
}

absl::StatusOr<v1::TrainingStateHeader> DecodeTrainingState(absl::string_view bytes,
                                                            const StateIdentity& expected,
                                                            Model& model,
                                                            torch::optim::Optimizer& optimizer) {
  absl::StatusOr<Framed> framed = ParseFraming(bytes);
  if (!framed.ok()) return framed.status();
  const v1::TrainingStateHeader& header = framed->header;
  if (absl::Status s = CheckStateIdentity(header, expected); !s.ok()) return s;
  const std::vector<NamedTensor> params = model.Parameters();
  const std::vector<NamedTensor> buffers = model.Buffers();
  Staged staged;
  std::remove_reference_t<decltype(optimizer.state())> state;
  try {
    if (absl::Status s = Stage(*framed, params, buffers, optimizer, &staged); !s.ok()) return s;
    // The new state map is built before anything is applied: it keys the
    // state by this optimizer's own parameters.
    const std::vector<OptimizerParam> mine = OptimizerParams(optimizer, KindOf(optimizer));
    for (size_t i = 0; i < mine.size(); ++i) {
      if (staged.optimizer[i] != nullptr) {
        state[StateKey(mine[i].tensor)] = std::move(staged.optimizer[i]);
      }
    }
  } catch (const std::exception& e) {
    return TorchErrorStatus(absl::StatusCode::kDataLoss,
                            "training state corrupt: LibTorch can't read it", e);
  }
  try {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i].second.copy_(staged.params[i]);
    for (size_t i = 0; i < buffers.size(); ++i) buffers[i].second.copy_(staged.buffers[i]);
    optimizer.state().swap(state);
    SetRngState(staged.rng);
  } catch (const std::exception& e) {
    return TorchErrorStatus(absl::StatusCode::kInternal, "applying the training state failed", e);
  }
  const std::string digest = ParameterDigest(model);
  if (digest != header.parameter_digest()) {
    return absl::InternalError(
        absl::StrCat("after loading the training state the parameters' digest is ", digest,
                     ", not ", header.parameter_digest()));
  }
  return header;
}

}  // namespace ddp
