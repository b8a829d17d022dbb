// TLS and bearer tokens for every gRPC connection, the one place both sides
// build them: the coordinator's server credentials, and the channels that
// workers, ddp-run and tools open to it.
//
// Files are read once, at start-up (a certificate that is replaced takes
// effect at the next start). Every error is INVALID_ARGUMENT and starts
// with "--flag=path: ", so a daemon can exit 2 with it as it is.
#ifndef DDP_COMMON_CREDENTIALS_H_
#define DDP_COMMON_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace ddp {

// Metadata keys. The bearer token rides in the standard "authorization:
// Bearer <token>" header (grpcurl -H sends it); a worker's store calls also
// carry the store token of its generation (Assignment.store_token).
inline constexpr char kAuthorizationMetadata[] = "authorization";
inline constexpr char kStoreTokenMetadata[] = "ddp-store-token";

// The values of --tls_cert, --tls_key and --tls_ca (paths to PEM files;
// empty: not given).
struct TlsFlags {
  std::string cert;
  std::string key;
  std::string ca;
  bool any() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// The coordinator's credentials: plaintext when no flag is given; TLS with
// cert and key; with ca too, every client must present a certificate that
// ca signed (mutual TLS), checked in the handshake. Errors: cert without
// key (or the other way), ca without cert, a file that can't be read or is
// not PEM, a key that does not match the certificate.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFlags& flags);

// What a client presents and trusts, read from its flags.
struct ClientSecurity {
  // TLS when any TLS flag was given: ca_pem is what the coordinator's
  // certificate must chain to (empty: the system's roots); cert_pem and
  // key_pem, when set, are the client certificate for mutual TLS.
  bool tls = false;
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  // Sent as "authorization: Bearer <token>" on every call; empty: none.
  std::string token;
};

// Reads the files behind a client's --tls_* flags and --token_file (either
// may be empty). Errors as for MakeServerCredentials, and for a token file
// that holds no token or more than one.
absl::StatusOr<ClientSecurity> LoadClientSecurity(const TlsFlags& flags,
                                                  const std::string& token_file);

// A channel to `target` with `security`'s credentials; its token is added
// to every call's metadata by a client interceptor, so callers set nothing
// per call. The token goes over plaintext too when TLS is off (loopback
// with a tokens file): that is the caller's choice to make.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const ClientSecurity& security,
                                           const grpc::ChannelArguments& args);

}  // namespace ddp

#endif  // DDP_COMMON_CREDENTIALS_H_
