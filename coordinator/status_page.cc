#include "coordinator/status_page.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/status_page_assets.h"
#include "google/protobuf/util/json_util.h"

namespace ddp {
namespace {

HttpResponse Text(int code, std::string body) {
  return {code, "text/plain; charset=utf-8", std::move(body)};
}

}  // namespace

std::vector<std::pair<std::string, std::string>> StatusPageHeaders() {
  return {{"Content-Security-Policy",
           "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
           "img-src 'self'; frame-ancestors 'none'; base-uri 'none'"},
          {"X-Content-Type-Options", "nosniff"},
          {"Referrer-Policy", "no-referrer"}};
}

StatusPageHandler::StatusPageHandler(SnapshotFn snapshot, const StatusHistory* history,
                                     const Clock* clock)
    : snapshot_(std::move(snapshot)), history_(history), clock_(clock) {}

HttpResponse StatusPageHandler::Respond(absl::string_view method, absl::string_view path) const {
  if (method != "GET" && method != "HEAD") return Text(405, "only GET and HEAD\n");
  if (path == "/api/status") return {200, "application/json", ApiStatus()};
  for (size_t i = 0; i < kStatusPageAssetCount; ++i) {
    const StaticAsset& asset = kStatusPageAssets[i];
    if (asset.path == path) {
      return {200, std::string(asset.content_type), std::string(asset.body)};
    }
  }
  return Text(404, absl::StrCat("no page at ", path.substr(0, 200), "\n"));
}

std::string StatusPageHandler::ApiStatus() const {
  const std::shared_ptr<const v1::JobStatus> status = snapshot_();
  std::string status_json = "null";
  if (status) {
    google::protobuf::util::JsonPrintOptions options;
    // The page reads every field; proto3 JSON would leave zeros out.
    options.always_print_primitive_fields = true;
    status_json.clear();
    if (!google::protobuf::util::MessageToJsonString(*status, &status_json, options).ok()) {
      status_json = "null";
    }
  }
  return absl::StrCat(
      "{\"now_unix_seconds\":",
      absl::StrFormat("%.3f", absl::ToDoubleSeconds(clock_->Now() - absl::UnixEpoch())),
      ",\"status\":", status_json, ",\"history\":", history_->ToJson(), "}");
}

}  // namespace ddp
