#include "worker/data/pack_index.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace ddp {
namespace {

absl::Status Bad(absl::string_view name, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": ", why, " (not an index ddp-pack wrote, or damaged)"));
}

// A name inside its folder: relative, no "." or ".." component, no NUL.
bool InsideFolder(const std::string& name) {
  if (name.empty() || name.front() == '/' || name.find('\0') != std::string::npos) return false;
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

template <typename Field>
void Truncate(Field* field, int n) {
  if (field->size() > n) field->Truncate(n);
}

}  // namespace

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (!in) return absl::InvalidArgumentError(absl::StrCat(path, ": can't be read"));
  return bytes.str();
}

uint32_t Crc32(absl::string_view bytes) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  while (!bytes.empty()) {
    const uInt n = static_cast<uInt>(std::min<size_t>(bytes.size(), 1u << 30));
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(bytes.data()), n);
    bytes.remove_prefix(n);
  }
  return static_cast<uint32_t>(crc);
}

absl::StatusOr<v1::PackIndex> ParsePackIndex(absl::string_view bytes, absl::string_view name,
                                             uint64_t limit) {
  v1::PackIndex index;
  if (!index.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return Bad(name, "can't be parsed");
  }
  const bool image = index.payload() == kPayloadImage;
  if (!image && index.payload() != kPayloadFloat32) {
    return Bad(name, absl::StrCat("unknown payload \"", absl::CEscape(index.payload()), "\""));
  }
  const int n = index.record_file_size();
  if (index.record_offset_size() != n || index.record_length_size() != n ||
      index.record_label_size() != n || index.record_crc32_size() != n ||
      (index.record_source_size() != 0 && index.record_source_size() != n)) {
    return Bad(name, "its record arrays differ in length");
  }
  for (const std::string& source : index.record_source()) {
    if (source.size() > kMaxRecordSourceBytes) {
      return Bad(name,
                 absl::StrCat("a record's source name is over ", kMaxRecordSourceBytes, " bytes"));
    }
  }
  if (n == 0) return Bad(name, "it lists no record");
  if (static_cast<size_t>(n) > kMaxPackRecords) {
    return Bad(name, absl::StrCat(n, " records; at most ", kMaxPackRecords));
  }
  if (index.classes_size() == 0) return Bad(name, "it lists no class");
  uint64_t floats = 0;
  if (!image) {
    if (index.sample_shape_size() < 1 || index.sample_shape_size() > 4) {
      return Bad(name, "a float32 pack needs a sample shape of 1 to 4 dimensions");
    }
    floats = 1;
    for (uint32_t d : index.sample_shape()) {
      if (d == 0 || (floats *= d) > kMaxRecordBytes / 4) return Bad(name, "bad sample shape");
    }
  }
  for (const v1::PackFile& file : index.files()) {
    if (!InsideFolder(file.name())) {
      return Bad(name, absl::StrCat("the file name \"", absl::CEscape(file.name()),
                                    "\" is not inside its folder"));
    }
  }
  if (limit > 0 && limit < static_cast<uint64_t>(n)) {
    const int keep = static_cast<int>(limit);
    Truncate(index.mutable_record_file(), keep);
    Truncate(index.mutable_record_offset(), keep);
    Truncate(index.mutable_record_length(), keep);
    Truncate(index.mutable_record_label(), keep);
    Truncate(index.mutable_record_crc32(), keep);
    if (index.record_source_size() > keep) {
      index.mutable_record_source()->DeleteSubrange(keep, index.record_source_size() - keep);
    }
  }
  for (int i = 0; i < index.record_file_size(); ++i) {
    const uint32_t f = index.record_file(i);
    const uint64_t offset = index.record_offset(i), length = index.record_length(i);
    if (f >= static_cast<uint32_t>(index.files_size())) {
      return Bad(name, absl::StrCat("record ", i, " names file ", f, " of ", index.files_size()));
    }
    const uint64_t size = index.files(static_cast<int>(f)).size();
    if (length == 0 || length > kMaxRecordBytes || offset > size || length > size - offset) {
      return Bad(name, absl::StrCat("record ", i, " does not lie inside its file"));
    }
    if (!image && length != floats * 4) {
      return Bad(name, absl::StrCat("record ", i, " has ", length, " bytes, not ", floats * 4));
    }
    if (index.record_label(i) >= static_cast<uint32_t>(index.classes_size())) {
      return Bad(name, absl::StrCat("record ", i, "'s label is not one of its ",
                                    index.classes_size(), " classes"));
    }
  }
  return index;
}

PackWriter::PackWriter(std::string dir, std::string payload, std::vector<uint32_t> sample_shape,
                       std::vector<std::string> classes, uint64_t shard_bytes)
    : dir_(std::move(dir)), shard_bytes_(shard_bytes) {
  index_.set_payload(std::move(payload));
  for (uint32_t d : sample_shape) index_.add_sample_shape(d);
  for (std::string& c : classes) index_.add_classes(std::move(c));
}

PackWriter::~PackWriter() {
  if (shard_ != nullptr) std::fclose(shard_);
}

absl::Status PackWriter::StartShard() {
  v1::PackFile* file = index_.add_files();
  file->set_name(absl::StrFormat("shard-%05d.ddp-rec", index_.files_size() - 1));
  const std::string path = absl::StrCat(dir_, "/", file->name());
  shard_ = std::fopen(path.c_str(), "wbx");
  if (shard_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": can't be created: ", std::strerror(errno),
                     errno == EEXIST ? " (pack into an empty folder)" : ""));
  }
  shard_size_ = 0;
  return absl::OkStatus();
}

absl::Status PackWriter::CloseShard() {
  if (shard_ == nullptr) return absl::OkStatus();
  const bool ok = std::fflush(shard_) == 0 && ::fsync(::fileno(shard_)) == 0;
  const int error = errno;
  std::fclose(shard_);
  shard_ = nullptr;
  index_.mutable_files()->rbegin()->set_size(shard_size_);
  if (!ok) {
    return absl::InternalError(
        absl::StrCat(dir_, ": writing a shard failed: ", std::strerror(error)));
  }
  return absl::OkStatus();
}

absl::Status PackWriter::Add(absl::string_view record, uint32_t label, absl::string_view source) {
  if (source.size() > kMaxRecordSourceBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a source name over ", kMaxRecordSourceBytes, " bytes"));
  }
  if (record.empty() || record.size() > kMaxRecordBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a record of ", record.size(), " bytes (1 to ", kMaxRecordBytes, ")"));
  }
  if (shard_ != nullptr && shard_size_ > 0 && shard_size_ + record.size() > shard_bytes_) {
    if (absl::Status s = CloseShard(); !s.ok()) return s;
  }
  if (shard_ == nullptr) {
    if (absl::Status s = StartShard(); !s.ok()) return s;
  }
  if (std::fwrite(record.data(), 1, record.size(), shard_) != record.size()) {
    return absl::InternalError(
        absl::StrCat(dir_, ": writing a shard failed: ", std::strerror(errno)));
  }
  index_.add_record_file(static_cast<uint32_t>(index_.files_size() - 1));
  index_.add_record_offset(shard_size_);
  index_.add_record_length(static_cast<uint32_t>(record.size()));
  index_.add_record_label(label);
  index_.add_record_crc32(Crc32(record));
  if (!source.empty()) index_.add_record_source(std::string(source));
  shard_size_ += record.size();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> PackWriter::Finish(absl::string_view source) {
  if (absl::Status s = CloseShard(); !s.ok()) return s;
  index_.set_source(std::string(source));
  if (absl::Status s = WritePackIndex(index_, absl::StrCat(dir_, "/", kPackIndexName)); !s.ok()) {
    return s;
  }
  return static_cast<uint64_t>(index_.record_file_size());
}

absl::Status WritePackIndex(const v1::PackIndex& index, const std::string& path) {
  const std::string temporary = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out || !index.SerializeToOstream(&out) || !out.flush()) {
      return absl::InternalError(absl::StrCat(temporary, ": can't be written"));
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat(path, ": can't be written: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::PackIndex> MakeImageManifest(const ImageFolder& folder,
                                                const std::string& root) {
  v1::PackIndex index;
  index.set_payload(kPayloadImage);
  for (const std::string& c : folder.classes()) index.add_classes(c);
  index.set_source(absl::StrCat("image folder ", root));
  const std::string prefix = absl::EndsWith(root, "/") ? root : absl::StrCat(root, "/");
  for (const ImageSample& sample : folder.samples()) {
    absl::StatusOr<std::string> bytes = ReadWholeFile(sample.path);
    if (!bytes.ok()) return bytes.status();
    if (bytes->empty() || bytes->size() > kMaxRecordBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(sample.path, ": is empty or over ", kMaxRecordBytes, " bytes"));
    }
    const std::string& b = *bytes;
    v1::PackFile* file = index.add_files();
    file->set_name(absl::StartsWith(sample.path, prefix) ? sample.path.substr(prefix.size())
                                                         : sample.path);
    file->set_size(b.size());
    index.add_record_file(static_cast<uint32_t>(index.files_size() - 1));
    index.add_record_offset(0);
    index.add_record_length(static_cast<uint32_t>(b.size()));
    index.add_record_label(static_cast<uint32_t>(sample.label));
    index.add_record_crc32(Crc32(b));
  }
  return index;
}

}  // namespace ddp
