#include "worker/elastic/state_records.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <utility>

#include <torch/types.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ddp::state_records {
namespace {

// Elements travel in the host's byte order, which the layout fixes as
// little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the state layout is little-endian");

// LibTorch's own limit on a tensor's dimensions.
constexpr uint8_t kMaxDims = 64;

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

}  // namespace

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

std::string Describe(c10::IntArrayRef sizes, c10::ScalarType dtype) {
  return absl::StrCat("[", absl::StrJoin(sizes, ", "), "] ", c10::toString(dtype));
}

std::string Describe(const at::Tensor& t) { return Describe(t.sizes(), t.scalar_type()); }

absl::StatusOr<Record> MakeRecord(std::string name, const at::Tensor& t) {
  absl::StatusOr<uint8_t> code = DtypeCode(t.scalar_type());
  if (!code.ok()) return code.status();
  if (t.dim() > kMaxDims) {
    return absl::InternalError(absl::StrCat("can't encode the training state: \"", name, "\" has ",
                                            t.dim(), " dimensions"));
  }
  return Record{std::move(name), t.detach().to(torch::kCPU).contiguous()};
}

absl::StatusOr<std::vector<Record>> MakeRecords(
    const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::vector<Record> out;
  for (const auto& [name, t] : tensors) {
    absl::StatusOr<Record> r = MakeRecord(name, t);
    if (!r.ok()) return r.status();
    out.push_back(std::move(*r));
  }
  return out;
}

size_t RecordSize(const Record& r) {
  return 4 + r.name.size() + 2 + 8 * r.tensor.dim() + r.tensor.nbytes();
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

absl::Status Reader::Bytes(size_t n, absl::string_view what, absl::string_view* out) {
  if (n > left()) {
    return absl::DataLossError(absl::StrCat("training state truncated: its payload has ", left(),
                                            " bytes left at offset ", at_, ", fewer than the ", n,
                                            " of ", what));
  }
  *out = payload_.substr(at_, n);
  at_ += n;
  return absl::OkStatus();
}

absl::Status Reader::Le(int width, absl::string_view what, uint64_t* out) {
  absl::string_view b;
  if (absl::Status s = Bytes(width, what, &b); !s.ok()) return s;
  *out = GetLe(b, 0, width);
  return absl::OkStatus();
}

absl::Status Reader::String(absl::string_view what, absl::string_view* out) {
  uint64_t n = 0;
  if (absl::Status s = Le(4, what, &n); !s.ok()) return s;
  return Bytes(n, what, out);
}

absl::Status Reader::Flag(absl::string_view what, bool* out) {
  uint64_t v = 0;
  if (absl::Status s = Le(1, what, &v); !s.ok()) return s;
  if (v > 1) {
    return absl::DataLossError(
        absl::StrCat("training state corrupt: ", what, " is ", v, ", not 0 or 1"));
  }
  *out = v == 1;
  return absl::OkStatus();
}

bool RecordHead::Matches(const at::Tensor& t) const {
  return dtype == t.scalar_type() && c10::IntArrayRef(sizes) == t.sizes();
}

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
    head->sizes.push_back(static_cast<int64_t>(size));
  }
  return absl::OkStatus();
}

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

}  // namespace ddp::state_records
