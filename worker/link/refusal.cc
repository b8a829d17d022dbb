#include "worker/link/refusal.h"

#include "absl/status/status.h"

namespace ddp {

RegisterFailure ClassifyRegisterFailure(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
    // From Attach, only a version that differs from the coordinator's.
    case grpc::StatusCode::FAILED_PRECONDITION:
      return RegisterFailure::kFatal;
    case grpc::StatusCode::ALREADY_EXISTS:
    // Too many Attach streams open at the coordinator just now.
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return RegisterFailure::kRefusedForNow;
    default:
      return RegisterFailure::kUnreachable;
  }
}

std::string RegisterFailureHint(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAUTHENTICATED:
      return "check --token_file: it must hold a worker token listed in the coordinator's "
             "--tokens_file";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "check --token_file: the token's role in the coordinator's --tokens_file must be "
             "worker";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "run the same build on every machine";
    case grpc::StatusCode::UNAVAILABLE:
      return "is the coordinator running at --coordinator, and do both sides agree on TLS "
             "(--tls_ca, --tls_cert, --tls_key)?";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "the coordinator has as many Attach streams open as its --max_attach_streams "
             "allows";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "is --coordinator the address of a ddp-coordinator?";
    default:
      return "";
  }
}

std::string StatusCodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace ddp
