#include "worker/elastic/state_codec.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "worker/elastic/optimizer_state.h"
#include "worker/elastic/state_records.h"
#include "worker/elastic/tensor_digest.h"
#include "worker/elastic/torch_error.h"

namespace ddp {
namespace {

using state_records::Crc32;
using state_records::GetLe;
using state_records::PutU32;
using state_records::PutU64;
using state_records::Reader;
using state_records::Record;

constexpr absl::string_view kMagic = "DDPSTATE";
// Where the header starts: after the magic, version and header length.
constexpr size_t kHeaderAt = 8 + 4 + 8;
// magic, version, header length, payload length, CRC.
constexpr size_t kFramingBytes = kHeaderAt + 8 + 4;

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

std::vector<at::Tensor> TensorsOf(const std::vector<NamedTensor>& named) {
  std::vector<at::Tensor> out;
  out.reserve(named.size());
  for (const auto& [name, t] : named) out.push_back(t);
  return out;
}

// Reads a tensors section into `out`, in the model's order, checking names,
// order, shapes and dtypes against `mine` before any data.
absl::Status ReadTensors(Reader& r, absl::string_view noun, const std::vector<NamedTensor>& mine,
                         std::vector<at::Tensor>* out) {
  using state_records::Describe;
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
    state_records::RecordHead head;
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
  state_records::ParamStates optimizer;
  at::Tensor rng;  // undefined: the RNG stays as it is
};

absl::Status Stage(const Framed& framed, const StateParts& parts, Staged* staged) {
  Reader r(framed.payload);
  if (absl::Status s = ReadTensors(r, "parameter", parts.parameters, &staged->params); !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadTensors(r, "buffer", parts.buffers, &staged->buffers); !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadOptimizer(r, parts.parameters, parts.optimizer, &staged->optimizer);
      !s.ok()) {
    return s;
  }
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
  if (!parts.rng) return absl::OkStatus();
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

v1::TrainingStateHeader StateHeader(const StateIdentity& identity, const TrainingProgress& progress,
                                    uint64_t generation, uint32_t world_size) {
  v1::TrainingStateHeader header;
  header.set_job_id(identity.job_id);
  header.set_spec_digest(identity.spec_digest);
  header.set_step(progress.step);
  header.set_epoch(progress.epoch);
  header.set_cursor(progress.cursor);
  header.set_world_size(world_size);
  header.set_generation(generation);
  header.set_created_unix_seconds(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  return header;
}

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

uint64_t MaxEncodedStateBytes(const StateParts& parts) {
  uint64_t param_bytes = 0;
  uint64_t buffer_bytes = 0;
  uint64_t names = 0;
  for (const auto& [name, t] : parts.parameters) {
    param_bytes += t.nbytes();
    names += name.size();
  }
  for (const auto& [name, t] : parts.buffers) {
    buffer_bytes += t.nbytes();
    names += name.size();
  }
  constexpr uint64_t kSlack = uint64_t{64} << 20;
  // The parameters and up to three optimizer tensors each (Adam with
  // amsgrad), the buffers (twice: generous), names, framing and header.
  return 4 * param_bytes + 2 * buffer_bytes + 16 * names + kSlack + kMaxProgramStateBytes;
}

absl::StatusOr<std::string> EncodeTrainingState(v1::TrainingStateHeader header,
                                                const StateParts& parts) {
  if (header.program_state().size() > kMaxProgramStateBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the program's own elastic state is ", header.program_state().size(),
                     " bytes; at most ", kMaxProgramStateBytes, " travel with a training state"));
  }
  try {
    header.set_format_version(kStateFormatVersion);
    header.clear_rng_state();
    if (parts.rng) {
      const at::Tensor rng = GetRngState();
      header.set_rng_state(std::string(static_cast<const char*>(rng.data_ptr()), rng.nbytes()));
    }
    header.set_parameter_digest(TensorDigest(TensorsOf(parts.parameters)));

    // Everything on the CPU first, so that the size is known and the string
    // grows once.
    absl::StatusOr<std::vector<Record>> params = state_records::MakeRecords(parts.parameters);
    if (!params.ok()) return params.status();
    absl::StatusOr<std::vector<Record>> buffers = state_records::MakeRecords(parts.buffers);
    if (!buffers.ok()) return buffers.status();
    absl::StatusOr<state_records::CapturedOptimizer> optimizer =
        state_records::CaptureOptimizer(parts.optimizer);
    if (!optimizer.ok()) return optimizer.status();
    size_t payload_size = 8 + 8 + OptimizerSize(*optimizer);
    for (const std::vector<Record>* list : {&*params, &*buffers}) {
      for (const Record& r : *list) payload_size += state_records::RecordSize(r);
    }

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
    PutOptimizer(&out, *optimizer);
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
                                                            const StateParts& parts) {
  absl::StatusOr<Framed> framed = ParseFraming(bytes);
  if (!framed.ok()) return framed.status();
  const v1::TrainingStateHeader& header = framed->header;
  if (absl::Status s = CheckStateIdentity(header, expected); !s.ok()) return s;
  if (header.program_state().size() > kMaxProgramStateBytes) {
    return absl::DataLossError(absl::StrCat("training state corrupt: its program state is ",
                                            header.program_state().size(), " bytes"));
  }
  Staged staged;
  state_records::StateMap state;
  try {
    if (absl::Status s = Stage(*framed, parts, &staged); !s.ok()) return s;
    // The new state map is built before anything is applied: it keys the
    // state by this optimizer's own parameters.
    if (parts.optimizer != nullptr) {
      state = state_records::KeyedStates(*parts.optimizer, std::move(staged.optimizer));
    }
  } catch (const std::exception& e) {
    return TorchErrorStatus(absl::StatusCode::kDataLoss,
                            "training state corrupt: LibTorch can't read it", e);
  }
  try {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < parts.parameters.size(); ++i) {
      parts.parameters[i].second.copy_(staged.params[i]);
    }
    for (size_t i = 0; i < parts.buffers.size(); ++i)
      parts.buffers[i].second.copy_(staged.buffers[i]);
    if (parts.optimizer != nullptr) parts.optimizer->state().swap(state);
    if (staged.rng.defined()) SetRngState(staged.rng);
  } catch (const std::exception& e) {
    return TorchErrorStatus(absl::StatusCode::kInternal, "applying the training state failed", e);
  }
  const std::string digest = TensorDigest(TensorsOf(parts.parameters));
  if (digest != header.parameter_digest()) {
    return absl::InternalError(
        absl::StrCat("after loading the training state the parameters' digest is ", digest,
                     ", not ", header.parameter_digest()));
  }
  return header;
}

}  // namespace ddp
