// Client of the coordinator's rendezvous store, bound to one job and
// generation: every key it touches lives in that generation's namespace, so
// a peer from an older generation can't be mistaken for a current one.
// Every call carries the member's store token (Assignment.store_token), the
// capability a coordinator that requires tokens checks; the bearer token is
// the stub's channel's business (common/credentials.h).
//
// Thread-safe.
#ifndef DDP_COMMON_STORE_CLIENT_H_
#define DDP_COMMON_STORE_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ddp/v1/coordinator.grpc.pb.h"

namespace ddp {

class StoreClient {
 public:
  StoreClient(std::shared_ptr<v1::Coordinator::StubInterface> stub, std::string job_id,
              uint64_t generation, std::string store_token = "")
      : stub_(std::move(stub)),
        job_id_(std::move(job_id)),
        generation_(generation),
        store_token_(std::move(store_token)) {}

  absl::Status Set(const std::string& key, const std::string& value);
  // Waits up to `timeout` for the key; DEADLINE_EXCEEDED when it never came.
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout);
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);

  const std::string& job_id() const { return job_id_; }
  uint64_t generation() const { return generation_; }

 private:
  void Prepare(grpc::ClientContext* context, absl::Duration timeout) const;

  std::shared_ptr<v1::Coordinator::StubInterface> stub_;
  const std::string job_id_;
  const uint64_t generation_;
  const std::string store_token_;
};

}  // namespace ddp

#endif  // DDP_COMMON_STORE_CLIENT_H_
