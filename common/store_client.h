// Client of the coordinator's rendezvous store, bound to one job and
// generation: every key it touches lives in that generation's namespace, so
// a peer from an older generation can't be mistaken for a current one.
// Every call carries the member's store token (Assignment.store_token), the
// capability a coordinator that requires tokens checks; the bearer token is
// the stub's channel's business (common/credentials.h).
//
// Given a way to make stubs, a call that a standby coordinator answers
// (UNAVAILABLE naming the leader, common/coordinator_targets.h) is made
// again on the leader, and later calls go there too. Without one, or when
// no leader is named, the call fails as the coordinator answered it.
//
// Thread-safe.
#ifndef DDP_COMMON_STORE_CLIENT_H_
#define DDP_COMMON_STORE_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ddp/v1/coordinator.grpc.pb.h"

namespace ddp {

class StoreClient {
 public:
  // A stub to the coordinator at an address (with the caller's TLS and
  // token).
  using StubFactory =
      std::function<std::shared_ptr<v1::Coordinator::StubInterface>(const std::string& target)>;

  // `leader_stubs`, when set, makes the stub for a leader a standby names.
  StoreClient(std::shared_ptr<v1::Coordinator::StubInterface> stub, std::string job_id,
              uint64_t generation, std::string store_token = "", StubFactory leader_stubs = nullptr)
      : job_id_(std::move(job_id)),
        generation_(generation),
        store_token_(std::move(store_token)),
        leader_stubs_(std::move(leader_stubs)),
        stub_(std::move(stub)) {}

  absl::Status Set(const std::string& key, const std::string& value);
  // Waits up to `timeout` for the key; DEADLINE_EXCEEDED when it never came.
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout);
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);

  const std::string& job_id() const { return job_id_; }
  uint64_t generation() const { return generation_; }

 private:
  // Makes one call through `call(stub, context)` (each try with a fresh
  // context and the same `deadline`), following a leader that a standby
  // names, a few hops at most.
  grpc::Status Call(absl::Time deadline,
                    const std::function<grpc::Status(v1::Coordinator::StubInterface& stub,
                                                     grpc::ClientContext* context)>& call);

  const std::string job_id_;
  const uint64_t generation_;
  const std::string store_token_;
  const StubFactory leader_stubs_;

  mutable absl::Mutex mu_;
  std::shared_ptr<v1::Coordinator::StubInterface> stub_ ABSL_GUARDED_BY(mu_);
  // The leader stub_ was made for ("": the stub given).
  std::string leader_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ddp

#endif  // DDP_COMMON_STORE_CLIENT_H_
