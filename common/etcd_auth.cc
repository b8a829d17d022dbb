#include "common/etcd_auth.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "etcd/etcd.grpc.pb.h"

namespace ddp {

absl::StatusOr<std::string> EtcdAuth::Token(const std::shared_ptr<grpc::Channel>& channel,
                                            absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (token_.empty()) {
    etcdserverpb::AuthenticateRequest request;
    request.set_name(user_);
    request.set_password(password_);
    etcdserverpb::AuthenticateResponse response;
    grpc::ClientContext call;
    call.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    const grpc::Status s =
        etcdserverpb::Auth::NewStub(channel)->Authenticate(&call, request, &response);
    if (!s.ok()) {
      return absl::Status(
          static_cast<absl::StatusCode>(s.error_code()),
          absl::StrCat("authenticating to etcd as ", user_, ": ", s.error_message()));
    }
    token_ = response.token();
  }
  return token_;
}

bool EtcdAuth::Refused(const grpc::Status& failure) {
  // etcd's ErrGRPCInvalidAuthToken, and ErrGRPCAuthOldRevision (the roles
  // changed since the token was given).
  const bool refused = (failure.error_code() == grpc::StatusCode::UNAUTHENTICATED &&
                        absl::StrContains(failure.error_message(), "invalid auth token")) ||
                       absl::StrContains(failure.error_message(), "revision of auth store is old");
  if (refused) {
    absl::MutexLock lock(&mu_);
    token_.clear();
  }
  return refused;
}

}  // namespace ddp
