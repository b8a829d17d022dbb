#include "worker/state_codec.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <type_traits>
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

constexpr absl::string_view kMagic = "DDPSTATE";
// Where the header starts: after the magic, version and header length.
constexpr size_t kHeaderAt = 8 + 4 + 8;
// magic, version, header length, payload length, CRC.
constexpr size_t kFramingBytes = kHeaderAt + 8 + 4;

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

std::string OptimizerKind(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return "SGD";
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return "AdamW";
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return "Adam";
  if (dynamic_cast<const torch::optim::Adagrad*>(&optimizer)) return "Adagrad";
  if (dynamic_cast<const torch::optim::RMSprop*>(&optimizer)) return "RMSprop";
  if (dynamic_cast<const torch::optim::LBFGS*>(&optimizer)) return "LBFGS";
  return typeid(optimizer).name();
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

std::string Describe(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "] ", c10::toString(t.scalar_type()));
}

// Reads `kind`s ("param", "buffer") from the archive into `out`, in the
// model's order, checking names, order, shapes and dtypes against `mine`.
absl::Status ReadTensors(torch::serialize::InputArchive& archive, const std::string& kind,
                         const std::vector<NamedTensor>& mine, std::vector<at::Tensor>* out) {
  const std::string noun = kind == "param" ? "parameter" : "buffer";
  c10::IValue names_value;
  if (!archive.try_read(absl::StrCat("meta/", kind, "s"), names_value) || !names_value.isList()) {
    return absl::DataLossError(absl::StrCat("training state corrupt: no list of ", noun, "s"));
  }
  std::vector<std::string> theirs;
  for (const c10::IValue& v : names_value.toListRef()) theirs.push_back(v.toStringRef());
  for (size_t i = 0; i < std::max(theirs.size(), mine.size()); ++i) {
    if (i >= mine.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the training state has ", theirs.size(), " ", noun, "s, this model ", mine.size(),
          ": it lacks ", noun, " \"", theirs[i], "\"; the state was saved by another model"));
    }
    if (i >= theirs.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the training state has ", theirs.size(), " ", noun, "s, this model ", mine.size(),
          ": the state lacks ", noun, " \"", mine[i].first, "\"; it was saved by another model"));
    }
    if (theirs[i] != mine[i].first) {
      return absl::FailedPreconditionError(
          absl::StrCat(noun, " ", i, " is \"", mine[i].first, "\" in this model but \"", theirs[i],
                       "\" in the training state; the state was saved by another model"));
    }
    at::Tensor t;
    if (!archive.try_read(absl::StrCat(kind, "/", theirs[i]), t, /*is_buffer=*/true) ||
        !t.defined()) {
      return absl::DataLossError(
          absl::StrCat("training state corrupt: ", noun, " \"", theirs[i], "\" is missing"));
    }
    const at::Tensor& m = mine[i].second;
    if (t.sizes() != m.sizes() || t.scalar_type() != m.scalar_type()) {
      return absl::FailedPreconditionError(absl::StrCat(
          noun, " \"", theirs[i], "\" is ", Describe(m), " in this model but ", Describe(t),
          " in the training state; the state was saved by another model"));
    }
    out->push_back(std::move(t));
  }
  return absl::OkStatus();
}

// Everything read and checked, nothing applied yet.
struct Staged {
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> buffers;
  torch::serialize::InputArchive optimizer;
  at::Tensor rng;
};

absl::Status Stage(const Framed& framed, const std::vector<NamedTensor>& params,
                   const std::vector<NamedTensor>& buffers,
                   const torch::optim::Optimizer& optimizer, Staged* staged) {
  torch::serialize::InputArchive archive;
  try {
    c10::optional<torch::Device> device;
    if (!params.empty()) device = params.front().second.device();
    archive.load_from(framed.payload.data(), framed.payload.size(), device);
  } catch (const std::exception& e) {
    return TorchErrorStatus(
        absl::StatusCode::kDataLoss,
        "training state corrupt: its payload is not an archive LibTorch can read", e);
  }
  if (absl::Status s = ReadTensors(archive, "param", params, &staged->params); !s.ok()) return s;
  if (absl::Status s = ReadTensors(archive, "buffer", buffers, &staged->buffers); !s.ok()) {
    return s;
  }
  c10::IValue kind;
  if (!archive.try_read("meta/optimizer", kind) || !kind.isString() ||
      !archive.try_read("optimizer", staged->optimizer)) {
    return absl::DataLossError("training state corrupt: no optimizer state");
  }
  if (kind.toStringRef() != OptimizerKind(optimizer)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the training state holds ", kind.toStringRef(),
                     " optimizer state but this worker's optimizer is ", OptimizerKind(optimizer),
                     "; the job's optimizer must match the one that saved it"));
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
  try {
    const at::Tensor rng = GetRngState();
    header.set_format_version(kStateFormatVersion);
    header.set_rng_state(std::string(static_cast<const char*>(rng.data_ptr()), rng.nbytes()));
    header.set_parameter_digest(ParameterDigest(model));

    torch::serialize::OutputArchive archive;
    auto write = [&archive](const std::string& kind, const std::vector<NamedTensor>& tensors) {
      c10::List<std::string> names;
      for (const auto& [name, t] : tensors) {
        archive.write(absl::StrCat(kind, "/", name), t.detach(), /*is_buffer=*/true);
        names.push_back(name);
      }
      archive.write(absl::StrCat("meta/", kind, "s"), c10::IValue(names));
    };
    write("param", model.Parameters());
    write("buffer", model.Buffers());
    archive.write("meta/optimizer", c10::IValue(OptimizerKind(optimizer)));
    torch::serialize::OutputArchive optimizer_archive(archive.compilation_unit());
    optimizer.save(optimizer_archive);
    archive.write("optimizer", optimizer_archive);

    const std::string header_bytes = header.SerializeAsString();
    std::string out;
    out.append(kMagic.data(), kMagic.size());
    PutU32(&out, kStateFormatVersion);
    PutU64(&out, header_bytes.size());
    out += header_bytes;
    const size_t length_at = out.size();
    PutU64(&out, 0);  // the payload's length, once known
    archive.save_to([&out](const void* data, size_t n) {
      out.append(static_cast<const char*>(data), n);
      return n;
    });
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
  try {
    if (absl::Status s = Stage(*framed, params, buffers, optimizer, &staged); !s.ok()) return s;
  } catch (const std::exception& e) {
    return TorchErrorStatus(absl::StatusCode::kDataLoss,
                            "training state corrupt: LibTorch can't read it", e);
  }

  // The optimizer first: it is the one step that can still fail, and it
  // fails whole (its previous state is put back).
  std::remove_reference_t<decltype(optimizer.state())> previous;
  previous.swap(optimizer.state());
  try {
    optimizer.load(staged.optimizer);
  } catch (const std::exception& e) {
    optimizer.state().swap(previous);
    return TorchErrorStatus(absl::StatusCode::kFailedPrecondition,
                            "can't load the training state's optimizer state (was this optimizer "
                            "built over other parameters?)",
                            e);
  }
  try {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i].second.copy_(staged.params[i]);
    for (size_t i = 0; i < buffers.size(); ++i) buffers[i].second.copy_(staged.buffers[i]);
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
