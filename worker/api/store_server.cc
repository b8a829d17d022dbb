#include "worker/api/store_server.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/credentials.h"
#include "common/grpc_status.h"
#include "common/kv_store.h"
#include "common/tokens.h"
#include "ddp/v1/coordinator.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace ddp {
namespace {

std::string Namespace(const std::string& job, uint64_t generation) {
  return absl::StrCat(job, "/", generation, "/");
}

class StoreService final : public v1::Coordinator::Service {
 public:
  explicit StoreService(std::string secret) : secret_(std::move(secret)) {}

  grpc::Status StoreSet(grpc::ServerContext* context, const v1::StoreSetRequest* request,
                        v1::StoreSetResponse*) override {
    if (grpc::Status s = CheckSecret(*context); !s.ok()) return s;
    return ToGrpcStatus(store_.Set(Namespace(request->job_id(), request->generation()),
                                   request->key(), request->value()));
  }

  grpc::Status StoreAdd(grpc::ServerContext* context, const v1::StoreAddRequest* request,
                        v1::StoreAddResponse* response) override {
    if (grpc::Status s = CheckSecret(*context); !s.ok()) return s;
    auto value = store_.Add(Namespace(request->job_id(), request->generation()), request->key(),
                            request->delta());
    if (!value.ok()) return ToGrpcStatus(value.status());
    response->set_value(*value);
    return grpc::Status::OK;
  }

  // A handler thread waits for the key: a session has a handful of ranks.
  grpc::Status StoreGet(grpc::ServerContext* context, const v1::StoreGetRequest* request,
                        v1::StoreGetResponse* response) override {
    if (grpc::Status s = CheckSecret(*context); !s.ok()) return s;
    const double seconds = request->timeout_seconds() > 0 ? request->timeout_seconds() : 30;
    const absl::Time deadline = absl::Now() + absl::Seconds(std::min(seconds, 3600.0));
    absl::Notification done;
    absl::StatusOr<std::string> result = absl::DeadlineExceededError("not answered");
    const KvStore::WaiterId waiter =
        store_.Get(Namespace(request->job_id(), request->generation()), request->key(), deadline,
                   [&](absl::StatusOr<std::string> value) {
                     result = std::move(value);
                     done.Notify();
                   });
    while (!done.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
      if (context->IsCancelled()) {
        store_.Cancel(waiter);
      } else if (absl::Now() >= deadline) {
        store_.ExpireWaiters();  // answers DEADLINE_EXCEEDED
      }
    }
    if (!result.ok()) return ToGrpcStatus(result.status());
    response->set_value(std::move(*result));
    return grpc::Status::OK;
  }

 private:
  grpc::Status CheckSecret(const grpc::ServerContext& context) const {
    if (secret_.empty()) return grpc::Status::OK;
    const auto& metadata = context.client_metadata();
    auto it = metadata.find(kStoreTokenMetadata);
    if (it == metadata.end()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "this rendezvous needs the job's secret and none was sent: set "
                          "DDP_STORE_SECRET to the value rank 0 was started with");
    }
    // Compared whatever its length, in time that says nothing of it.
    if (!ConstantTimeEquals(absl::string_view(it->second.data(), it->second.size()), secret_)) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "the secret sent is not this rendezvous's: DDP_STORE_SECRET must be the "
                          "same on every rank (or another job is using MASTER_PORT)");
    }
    return grpc::Status::OK;
  }

  const std::string secret_;
  KvStore store_{RealClock::Get()};
};

}  // namespace

struct StoreServer::Impl {
  explicit Impl(std::string secret) : service(std::move(secret)) {}
  StoreService service;
  std::unique_ptr<grpc::Server> server;
};

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StoreServer::~StoreServer() { impl_->server->Shutdown(absl::ToChronoTime(absl::Now())); }

absl::StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(const std::string& address,
                                                                const std::string& secret) {
  auto impl = std::make_unique<Impl>(secret);
  grpc::ServerBuilder builder;
  // gRPC binds with SO_REUSEPORT by default: a second job's rank 0 would
  // share the port with the first, the two stores taking each other's
  // connections, and both rendezvous would fail only at their timeout.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&impl->service);
  impl->server = builder.BuildAndStart();
  if (!impl->server || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("rank 0 can't serve the rendezvous at ", address,
                     " (MASTER_ADDR:MASTER_PORT): the port is in use (by another job's rank "
                     "0?), or it is not an address of this host"));
  }
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl)));
}

}  // namespace ddp
