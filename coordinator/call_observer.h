// Who hears when an RPC starts and how it ended (RpcMetrics). Unary calls
// are observed by a gRPC interceptor; the Attach stream reports itself,
// because with any interceptor installed every message of every stream
// goes through gRPC's interception path (a quarter of the coordinator's
// CPU at 4,096 workers reporting 10 steps a second each).
#ifndef DDP_COORDINATOR_CALL_OBSERVER_H_
#define DDP_COORDINATOR_CALL_OBSERVER_H_

#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace ddp {

class CallObserver {
 public:
  virtual ~CallObserver() = default;
  // `method` as gRPC names it ("/ddp.v1.Coordinator/Attach"); `code` a
  // grpc::StatusCode.
  virtual void Started(absl::string_view method) = 0;
  virtual void Handled(absl::string_view method, int code, absl::Duration took) = 0;
  virtual const Clock* clock() const = 0;
};

// One call, told to an observer (or to no one, when it is null): started
// at construction; handled at the first Handled, or CANCELLED when it is
// destroyed without one. Not thread-safe: a call's owner uses it from one
// thread at a time.
class ObservedCall {
 public:
  ObservedCall(CallObserver* observer, std::string method)
      : observer_(observer), method_(std::move(method)) {
    if (observer_ == nullptr) return;
    start_ = observer_->clock()->Now();
    observer_->Started(method_);
  }
  ~ObservedCall() { Handled(kCancelled); }
  ObservedCall(const ObservedCall&) = delete;
  ObservedCall& operator=(const ObservedCall&) = delete;

  void Handled(int code) {
    if (observer_ == nullptr || handled_) return;
    handled_ = true;
    observer_->Handled(method_, code, observer_->clock()->Now() - start_);
  }

 private:
  static constexpr int kCancelled = 1;  // grpc::StatusCode::CANCELLED
  CallObserver* const observer_;
  const std::string method_;
  absl::Time start_;
  bool handled_ = false;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_CALL_OBSERVER_H_
