// libFuzzer: ddp-pack indexes as a job's data folder may hold them,
// anything at all. The parser must never crash or allocate without bound;
// an index it accepts keeps every record inside its file and every label a
// class, so that a worker reading it reads only where it was told.
#include <cstddef>
#include <cstdint>
#include <string>

#include "worker/data/pack_index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  for (uint64_t limit : {uint64_t{0}, uint64_t{2}}) {
    absl::StatusOr<ddp::v1::PackIndex> index = ddp::ParsePackIndex(input, "fuzz", limit);
    if (!index.ok()) continue;
    const int n = index->record_file_size();
    if (n == 0 || (limit > 0 && static_cast<uint64_t>(n) > limit)) __builtin_trap();
    for (int i = 0; i < n; ++i) {
      if (index->record_file(i) >= static_cast<uint32_t>(index->files_size())) __builtin_trap();
      const uint64_t file_size = index->files(static_cast<int>(index->record_file(i))).size();
      if (index->record_offset(i) + index->record_length(i) > file_size) __builtin_trap();
      if (index->record_label(i) >= static_cast<uint32_t>(index->classes_size())) {
        __builtin_trap();
      }
    }
  }
  return 0;
}
