// The state codec's building blocks (worker/elastic/state_codec.h has the layout):
// little-endian integers, the CRC, and tensor records written from this
// rank's tensors and read back against them. Internal to the codec.
#ifndef DDP_WORKER_ELASTIC_STATE_RECORDS_H_
#define DDP_WORKER_ELASTIC_STATE_RECORDS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ddp::state_records {

void PutU32(std::string* out, uint32_t v);
void PutU64(std::string* out, uint64_t v);
// The `width`-byte little-endian integer at `at` (the caller checked the
// length).
uint64_t GetLe(absl::string_view bytes, size_t at, int width);
uint32_t Crc32(absl::string_view data);

// "[3, 4] Float": how refusals name a tensor's shape and dtype.
std::string Describe(c10::IntArrayRef sizes, c10::ScalarType dtype);
std::string Describe(const at::Tensor& t);

// A tensor to write, on the CPU and contiguous, so that its bytes can be
// appended as they lie.
struct Record {
  std::string name;
  at::Tensor tensor;
};
// INTERNAL for a dtype the layout has no code for, or too many dimensions.
absl::StatusOr<Record> MakeRecord(std::string name, const at::Tensor& t);
// MakeRecord over a list, in order.
absl::StatusOr<std::vector<Record>> MakeRecords(
    const std::vector<std::pair<std::string, at::Tensor>>& tensors);
// The bytes PutRecord writes.
size_t RecordSize(const Record& r);
void PutString(std::string* out, absl::string_view s);
void PutRecord(std::string* out, const Record& r);

// Reads a payload front to back. Every read checks what is left first; a
// failed read is DATA_LOSS, "truncated".
class Reader {
 public:
  explicit Reader(absl::string_view payload) : payload_(payload) {}

  size_t left() const { return payload_.size() - at_; }
  absl::Status Bytes(size_t n, absl::string_view what, absl::string_view* out);
  absl::Status Le(int width, absl::string_view what, uint64_t* out);
  // A u32 length, then that many bytes.
  absl::Status String(absl::string_view what, absl::string_view* out);
  // One byte, 0 or 1 (DATA_LOSS otherwise).
  absl::Status Flag(absl::string_view what, bool* out);

 private:
  absl::string_view payload_;
  size_t at_ = 0;
};

// A record's name, dtype and sizes, before its data.
struct RecordHead {
  absl::string_view name;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<int64_t> sizes;  // compared, never used to allocate

  bool Matches(const at::Tensor& t) const;
};
absl::Status ReadHead(Reader& r, absl::string_view what, RecordHead* head);

// The data of a record whose head matched `like` (this rank's own tensor):
// its length is like's, whatever the bytes say, copied into a new CPU
// tensor of like's shape and dtype.
absl::Status ReadData(Reader& r, const at::Tensor& like, absl::string_view what, at::Tensor* out);

}  // namespace ddp::state_records

#endif  // DDP_WORKER_ELASTIC_STATE_RECORDS_H_
