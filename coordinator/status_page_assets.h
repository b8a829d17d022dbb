// The status page's static files, embedded at build time from
// coordinator/web/ (see coordinator/CMakeLists.txt), so the binary serves
// them with nothing on disk and nothing fetched from the internet.
#ifndef DDP_COORDINATOR_STATUS_PAGE_ASSETS_H_
#define DDP_COORDINATOR_STATUS_PAGE_ASSETS_H_

#include <cstddef>

#include "absl/strings/string_view.h"

namespace ddp {

struct StaticAsset {
  absl::string_view path;  // the URL path it is served at
  absl::string_view content_type;
  absl::string_view body;
};

extern const StaticAsset kStatusPageAssets[];
extern const size_t kStatusPageAssetCount;

}  // namespace ddp

#endif  // DDP_COORDINATOR_STATUS_PAGE_ASSETS_H_
