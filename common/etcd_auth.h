// etcd's own user authentication (its RBAC): a client authenticates with a
// user name and password and sends the token etcd gives back as the
// "token" metadata of every call. etcd's simple tokens expire (5 minutes
// idle by default) and a restarted member forgets them: a call refused for
// its token authenticates again and is retried once.
//
// Thread-safe.
#ifndef DDP_COMMON_ETCD_AUTH_H_
#define DDP_COMMON_ETCD_AUTH_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"

namespace ddp {

class EtcdAuth {
 public:
  EtcdAuth(std::string user, std::string password)
      : user_(std::move(user)), password_(std::move(password)) {}

  // The token, authenticating at the member behind `channel` first when
  // there is none. UNAUTHENTICATED (the user or the password refused) names
  // the user, never the password.
  absl::StatusOr<std::string> Token(const std::shared_ptr<grpc::Channel>& channel,
                                    absl::Duration timeout);
  // Whether a call failed for its token (expired, or unknown to a member
  // that restarted); then the next AddToken authenticates again.
  bool Refused(const grpc::Status& failure);

  const std::string& user() const { return user_; }

 private:
  const std::string user_;
  const std::string password_;
  absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_COMMON_ETCD_AUTH_H_
