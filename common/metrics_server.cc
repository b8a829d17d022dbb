#include "common/metrics_server.h"

#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "prometheus/collectable.h"
#include "prometheus/text_serializer.h"

namespace ddp {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen,
                                                                    const HttpAccess& access) {
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  HttpServer::Options options;
  options.what = "metrics";
  options.flag = "--metrics_listen";
  options.listen = listen;
  options.access = access;
  // Scrapes are rare and cheap.
  options.threads = 2;
  MetricsServer* self = server.get();
  auto http = HttpServer::Start(std::move(options),
                                [self](absl::string_view method, absl::string_view path) {
                                  return self->Scrape(method, path);
                                });
  if (!http.ok()) return http.status();
  server->http_ = std::move(*http);
  return server;
}

MetricsServer::~MetricsServer() { http_.reset(); }

void MetricsServer::Register(const std::shared_ptr<prometheus::Collectable>& collectable) {
  absl::MutexLock lock(&mu_);
  collectables_.push_back(collectable);
}

HttpResponse MetricsServer::Scrape(absl::string_view method, absl::string_view path) const {
  if (method != "GET" && method != "HEAD") return {405, "text/plain", "only GET and HEAD\n"};
  if (path != "/metrics") return {404, "text/plain", "metrics are at /metrics\n"};
  std::vector<std::shared_ptr<prometheus::Collectable>> live;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& weak : collectables_) {
      if (auto c = weak.lock()) live.push_back(std::move(c));
    }
  }
  std::vector<prometheus::MetricFamily> families;
  for (const auto& c : live) {
    std::vector<prometheus::MetricFamily> more = c->Collect();
    families.insert(families.end(), std::make_move_iterator(more.begin()),
                    std::make_move_iterator(more.end()));
  }
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return {200, "text/plain; version=0.0.4; charset=utf-8", out.str()};
}

absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServer(const std::string& listen,
                                                                  const HttpAccess& access,
                                                                  bool required) {
  if (listen.empty()) return std::unique_ptr<MetricsServer>();
  auto server = MetricsServer::Start(listen, access);
  if (server.ok()) {
    DDP_LOG(Info) << "serving Prometheus metrics at " << (*server)->url() << "/metrics"
                  << (access.tokens.empty() ? "" : " (tokens required)");
    return server;
  }
  if (required || !absl::IsUnavailable(server.status())) return server.status();
  DDP_LOG(Warning) << server.status().message()
                   << "; running without metrics (set --metrics_listen to choose another)";
  return std::unique_ptr<MetricsServer>();
}

}  // namespace ddp
