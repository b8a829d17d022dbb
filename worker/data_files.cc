#include "worker/data_files.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cstring>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ddp {
namespace {

uint32_t BigEndian32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// Reads a file's bytes as gzread would: inflated when they are gzip, as
// they are otherwise; only as far as asked, so a small header over a huge
// (gzip-bomb) payload costs what the header declares.
class GzBytes {
 public:
  explicit GzBytes(const std::string& bytes) : bytes_(bytes) {
    gzip_ = bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
            static_cast<unsigned char>(bytes[1]) == 0x8b;
    if (gzip_) {
      ok_ = inflateInit2(&z_, 15 + 16) == Z_OK;
      z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes_.data()));
      z_.avail_in = static_cast<uInt>(std::min<size_t>(bytes_.size(), 1u << 30));
      consumed_ = z_.avail_in;
    }
  }
  ~GzBytes() {
    if (gzip_ && ok_) inflateEnd(&z_);
  }
  GzBytes(const GzBytes&) = delete;
  GzBytes& operator=(const GzBytes&) = delete;

  // Into `out` until `size` bytes or the end; false on corrupt data.
  bool Read(void* out, uint64_t size, uint64_t* got) {
    *got = 0;
    if (!gzip_) {
      const uint64_t n = std::min<uint64_t>(size, bytes_.size() - raw_at_);
      std::memcpy(out, bytes_.data() + raw_at_, n);
      raw_at_ += n;
      *got = n;
      return true;
    }
    if (!ok_) return false;
    auto* p = static_cast<Bytef*>(out);
    while (*got < size && !ended_) {
      if (z_.avail_in == 0 && consumed_ < bytes_.size()) {
        const size_t next = std::min<size_t>(bytes_.size() - consumed_, 1u << 30);
        z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes_.data() + consumed_));
        z_.avail_in = static_cast<uInt>(next);
        consumed_ += next;
      }
      const uInt chunk = static_cast<uInt>(std::min<uint64_t>(size - *got, 1u << 30));
      z_.next_out = p + *got;
      z_.avail_out = chunk;
      const int rc = inflate(&z_, Z_NO_FLUSH);
      *got += chunk - z_.avail_out;
      // With room to write and every input byte offered, no progress
      // (Z_BUF_ERROR) means the input ran out: truncated, the rest is short.
      if (rc == Z_STREAM_END || rc == Z_BUF_ERROR) {
        ended_ = true;
      } else if (rc != Z_OK) {
        return false;
      }
    }
    return true;
  }

 private:
  const std::string& bytes_;
  bool gzip_ = false;
  bool ok_ = false;
  bool ended_ = false;
  z_stream z_{};
  size_t consumed_ = 0;
  size_t raw_at_ = 0;
};

// A tensor that owns no more storage than it shows: an expanded view (a
// stride of 0) would turn one stored element into 10^12 on conversion.
bool BackedByItsStorage(const at::Tensor& t) {
  if (!t.is_non_overlapping_and_dense()) return false;
  const uint64_t needed =
      (static_cast<uint64_t>(t.storage_offset()) + static_cast<uint64_t>(t.numel())) *
      t.element_size();
  return t.storage().nbytes() >= needed;
}

}  // namespace

absl::Status CheckDataFile(const std::string& field, const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": can't read ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", path, " is ", FileKind(st.st_mode), ", not a regular file"));
  }
  if (static_cast<uint64_t>(st.st_size) > kMaxDataFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, " has ", st.st_size,
                                                   " bytes; the limit is ", kMaxDataFileBytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> ReadIdxFile(const std::string& path, InputFiles* inputs) {
  if (absl::Status s = CheckDataFile("dataset.path", path); !s.ok()) return s;
  InputFiles unpinned;
  absl::StatusOr<std::string> bytes =
      (inputs ? inputs : &unpinned)->Read("dataset.path", path, kMaxDataFileBytes);
  if (!bytes.ok()) return bytes.status();
  GzBytes f(*bytes);
  const auto not_idx = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset.path: ", path, " is not a uint8 idx file"));
  };
  // Magic: two zero bytes, the type (0x08 = uint8), the number of dimensions.
  unsigned char header[4 + 4 * 4];
  uint64_t got = 0;
  if (!f.Read(header, 4, &got) || got != 4) return not_idx();
  if (header[0] != 0 || header[1] != 0 || header[2] != 0x08 || header[3] < 1 || header[3] > 4) {
    return not_idx();
  }
  const int dims = header[3];
  if (!f.Read(header + 4, 4u * dims, &got) || got != 4u * dims) {
    return absl::InvalidArgumentError(absl::StrCat("dataset.path: ", path, " is truncated"));
  }
  std::vector<int64_t> shape;
  uint64_t count = 1;
  for (int i = 0; i < dims; ++i) {
    const uint32_t size = BigEndian32(header + 4 + 4 * i);
    shape.push_back(size);
    // Checked before multiplying: the product never overflows.
    if (size != 0 && count > kMaxDataFileBytes / size) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset.path: ", path, " declares shape [", absl::StrJoin(shape, ", "),
                       ", ...]: more than the limit of ", kMaxDataFileBytes, " bytes"));
    }
    count *= size;
  }
  at::Tensor t = at::empty(shape, at::kByte);
  if (!f.Read(t.data_ptr(), count, &got)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset.path: ", path, " is not a readable gzip file"));
  }
  char extra;
  uint64_t more = 0;
  if (got != count || !f.Read(&extra, 1, &more) || more != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.path: ", path, " holds ", got == count ? "more" : absl::StrCat(got),
        " bytes of data, not ", count, " for shape [", absl::StrJoin(shape, ", "), "]"));
  }
  return t;
}

absl::Status CheckTensorPair(const std::string& field, const std::string& path, const at::Tensor& x,
                             const at::Tensor& y) {
  if (y.dim() != 1 || x.dim() < 2 || x.size(0) != y.size(0) ||
      at::isFloatingType(y.scalar_type()) || y.scalar_type() == at::kBool ||
      at::isComplexType(x.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", path, " needs x of shape [N, ...] and integer labels y of shape [N]; got x ",
        c10::str(x.sizes()), " ", std::string(x.dtype().name()), " and y ", c10::str(y.sizes()),
        " ", std::string(y.dtype().name())));
  }
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"x", x}, {"y", y}}) {
    if (t.numel() > kMaxDataElements) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, " has ", t.numel(),
                                                     " elements in ", name, "; the limit is ",
                                                     kMaxDataElements));
    }
    if (!BackedByItsStorage(t)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", path, ": ", name,
                       " is a view larger than the data saved for it (save a contiguous "
                       "tensor: x.contiguous())"));
    }
  }
  if (y.numel() > 0) {
    const int64_t lowest = y.min().item<int64_t>();
    const int64_t highest = y.max().item<int64_t>();
    if (lowest < 0 || highest >= kMaxClasses) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", path, " has labels from ", lowest, " to ", highest,
                       "; labels must be class indices from 0 to ", kMaxClasses - 1));
    }
  }
  return absl::OkStatus();
}

}  // namespace ddp
