// ddp-pack's index (proto/ddp/v1/pack.proto): read and checked before a
// worker trusts a byte of it, and written by ddp-pack.
//
// No LibTorch.
#ifndef DDP_WORKER_DATA_PACK_INDEX_H_
#define DDP_WORKER_DATA_PACK_INDEX_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/job_spec.h"
#include "ddp/v1/pack.pb.h"
#include "worker/data/image_folder.h"

namespace ddp {

// The index's name in a shards folder.
inline constexpr const char* kPackIndexName = kShardsIndexName;
inline constexpr char kPayloadImage[] = "encoded-image";
inline constexpr char kPayloadFloat32[] = "float32";
// Bounds on what an index may make a worker hold or read.
inline constexpr size_t kMaxPackRecords = 50'000'000;
inline constexpr uint32_t kMaxRecordBytes = 256u << 20;
// The longest name of a record's source image an index may hold.
inline constexpr size_t kMaxRecordSourceBytes = 4096;

// `bytes` parsed and checked (`name`, the index's path, in every error):
// a known payload, parallel arrays of one length, every record inside its
// file, every label a class, float32 records of the shape's size, file
// names relative and inside their folder. INVALID_ARGUMENT saying what is
// wrong. `limit` (non-zero): the first `limit` records only.
absl::StatusOr<v1::PackIndex> ParsePackIndex(absl::string_view bytes, absl::string_view name,
                                             uint64_t limit = 0);

// The bytes of `path`, a file ddp-pack packs or an index a program reads
// (not a job's input: those are read pinned, worker/input_files.h).
// INVALID_ARGUMENT naming it when it can't be read.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// zlib's CRC-32 of `bytes`.
uint32_t Crc32(absl::string_view bytes);

// Writes records into shards of about `shard_bytes` each in `dir` (which
// must exist) and, at Finish, the index beside them (through a temporary
// file renamed, so a half-written pack has no index).
class PackWriter {
 public:
  PackWriter(std::string dir, std::string payload, std::vector<uint32_t> sample_shape,
             std::vector<std::string> classes, uint64_t shard_bytes);
  ~PackWriter();
  PackWriter(const PackWriter&) = delete;
  PackWriter& operator=(const PackWriter&) = delete;

  // `source`: the record's image, relative to the folder packed (kept in the
  // index, so that a bad record is named by it); empty for tensors. Every
  // record of a pack has one, or none has.
  absl::Status Add(absl::string_view record, uint32_t label, absl::string_view source = {});
  // Writes the index; `source` says what was packed. The number of records.
  absl::StatusOr<uint64_t> Finish(absl::string_view source);

 private:
  absl::Status StartShard();
  absl::Status CloseShard();

  const std::string dir_;
  const uint64_t shard_bytes_;
  v1::PackIndex index_;
  std::FILE* shard_ = nullptr;
  uint64_t shard_size_ = 0;
};

// Writes `index` to `path` through a temporary file renamed into place: a
// reader finds the old index or the new one, never half of one.
absl::Status WritePackIndex(const v1::PackIndex& index, const std::string& path);

// A manifest of `folder` (scanned from `root`): one record per image, the
// whole file, its size and CRC-32 read now; names relative to `root`.
absl::StatusOr<v1::PackIndex> MakeImageManifest(const ImageFolder& folder, const std::string& root);

}  // namespace ddp

#endif  // DDP_WORKER_DATA_PACK_INDEX_H_
