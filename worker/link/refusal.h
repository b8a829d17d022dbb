// What a worker does when its register is not answered with Registered:
// a pure decision on the gRPC status, so the table is tested alone.
//
// Retrying cures an outage, a coordinator that is restarting or shutting
// down, a duplicate device whose owner is about to be marked lost; it can't
// cure a wrong token, a wrong role, a malformed request or another build's
// version, so those end the worker (exit 2) with the coordinator's reason.
// This is about the handshake only: an established session that ends is
// never a refusal (training goes on through a coordinator outage).
#ifndef DDP_WORKER_LINK_REFUSAL_H_
#define DDP_WORKER_LINK_REFUSAL_H_

#include <string>

#include "grpcpp/support/status.h"

namespace ddp {

enum class RegisterFailure {
  // The coordinator refused for good: exit 2 with its reason.
  kFatal,
  // The coordinator refused for now (ALREADY_EXISTS: the device is taken):
  // say so, and retry.
  kRefusedForNow,
  // No answer from a coordinator (connection refused, TLS handshake failed,
  // no reply within the deadline, shutting down): log the error, retry.
  kUnreachable,
};

RegisterFailure ClassifyRegisterFailure(grpc::StatusCode code);

// What the worker can do about `code`, in a few words ("" when nothing
// useful can be said): points at the flag to check.
std::string RegisterFailureHint(grpc::StatusCode code);

// "UNAVAILABLE", "PERMISSION_DENIED", ...
std::string StatusCodeName(grpc::StatusCode code);

}  // namespace ddp

#endif  // DDP_WORKER_LINK_REFUSAL_H_
