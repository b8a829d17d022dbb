#include "common/store_client.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/coordinator_targets.h"
#include "common/credentials.h"
#include "common/grpc_status.h"

namespace ddp {
namespace {

// Unary store calls other than a waiting get should answer at once.
constexpr absl::Duration kCallTimeout = absl::Seconds(30);
// A waiting get's client deadline is this much past the wait it asks for:
// the server answers DEADLINE_EXCEEDED itself, and the margin keeps the
// client's deadline from racing it.
constexpr absl::Duration kGetMargin = absl::Seconds(5);

absl::Status WithContext(const grpc::Status& s, const std::string& what) {
  absl::Status status = FromGrpcStatus(s);
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

}  // namespace

grpc::Status StoreClient::Call(
    absl::Time deadline, const std::function<grpc::Status(v1::Coordinator::StubInterface& stub,
                                                          grpc::ClientContext* context)>& call) {
  for (int hop = 0;; ++hop) {
    std::shared_ptr<v1::Coordinator::StubInterface> stub;
    std::string target;
    {
      absl::MutexLock lock(&mu_);
      stub = stub_;
      target = leader_;
    }
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    if (!store_token_.empty()) context.AddMetadata(kStoreTokenMetadata, store_token_);
    const grpc::Status status = call(*stub, &context);
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE || !leader_stubs_ ||
        hop == kMaxLeaderHops) {
      return status;
    }
    // A standby answers before it does anything, so even an add is safe to
    // make again on the leader; an UNAVAILABLE that names no leader may
    // come from a leader that died mid-call, and is not retried.
    const std::string leader = LeaderHint(context);
    if (leader.empty() || leader == target) return status;
    std::shared_ptr<v1::Coordinator::StubInterface> next = leader_stubs_(leader);
    absl::MutexLock lock(&mu_);
    // Another call may have followed the same hint meanwhile.
    if (stub_ == stub) {
      stub_ = std::move(next);
      leader_ = leader;
    }
  }
}

absl::Status StoreClient::Set(const std::string& key, const std::string& value) {
  v1::StoreSetRequest request;
  request.set_job_id(job_id_);
  request.set_generation(generation_);
  request.set_key(key);
  request.set_value(value);
  v1::StoreSetResponse response;
  const grpc::Status status =
      Call(absl::Now() + kCallTimeout,
           [&](v1::Coordinator::StubInterface& stub, grpc::ClientContext* context) {
             return stub.StoreSet(context, request, &response);
           });
  return WithContext(status, absl::StrCat("store set ", key));
}

absl::StatusOr<std::string> StoreClient::Get(const std::string& key, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout + kGetMargin;
  v1::StoreGetRequest request;
  request.set_job_id(job_id_);
  request.set_generation(generation_);
  request.set_key(key);
  v1::StoreGetResponse response;
  request.set_timeout_seconds(absl::ToDoubleSeconds(timeout));
  bool first = true;
  const grpc::Status status =
      Call(deadline, [&](v1::Coordinator::StubInterface& stub, grpc::ClientContext* context) {
        // On the leader after a standby's answer: what is left of the wait.
        if (!first) {
          request.set_timeout_seconds(absl::ToDoubleSeconds(
              std::max(absl::ZeroDuration(), deadline - kGetMargin - absl::Now())));
        }
        first = false;
        return stub.StoreGet(context, request, &response);
      });
  absl::Status s = WithContext(status, absl::StrCat("store get ", key));
  if (!s.ok()) return s;
  return std::move(*response.mutable_value());
}

absl::StatusOr<int64_t> StoreClient::Add(const std::string& key, int64_t delta) {
  v1::StoreAddRequest request;
  request.set_job_id(job_id_);
  request.set_generation(generation_);
  request.set_key(key);
  request.set_delta(delta);
  v1::StoreAddResponse response;
  const grpc::Status status =
      Call(absl::Now() + kCallTimeout,
           [&](v1::Coordinator::StubInterface& stub, grpc::ClientContext* context) {
             return stub.StoreAdd(context, request, &response);
           });
  absl::Status s = WithContext(status, absl::StrCat("store add ", key));
  if (!s.ok()) return s;
  return response.value();
}

}  // namespace ddp
