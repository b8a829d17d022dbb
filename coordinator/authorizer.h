// Who may call what on ddp.v1.Coordinator, decided in one place: a table
// of method -> roles, and the bearer tokens of --tokens_file. Every handler
// of CoordinatorService asks Check before it does anything (the Attach
// reactor before it reads a message). grpc.health.v1.Health and server
// reflection are other services, and stay open.
//
//   worker    Attach, StoreSet, StoreGet, StoreAdd (the store only with its
//             generation's store token; the core checks that)
//   operator  GetStatus, ListWorkers, WatchStatus, ListJobs, GetJob
//   admin     SubmitJob, CancelJob, and everything an operator may
//
// Thread-safe: const after construction.
#ifndef DDP_COORDINATOR_AUTHORIZER_H_
#define DDP_COORDINATOR_AUTHORIZER_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/tokens.h"
#include "grpcpp/grpcpp.h"

namespace ddp {

// Full method names, as gRPC writes them.
namespace method {
inline constexpr char kAttach[] = "/ddp.v1.Coordinator/Attach";
inline constexpr char kStoreSet[] = "/ddp.v1.Coordinator/StoreSet";
inline constexpr char kStoreGet[] = "/ddp.v1.Coordinator/StoreGet";
inline constexpr char kStoreAdd[] = "/ddp.v1.Coordinator/StoreAdd";
inline constexpr char kGetStatus[] = "/ddp.v1.Coordinator/GetStatus";
inline constexpr char kListWorkers[] = "/ddp.v1.Coordinator/ListWorkers";
inline constexpr char kWatchStatus[] = "/ddp.v1.Coordinator/WatchStatus";
inline constexpr char kSubmitJob[] = "/ddp.v1.Coordinator/SubmitJob";
inline constexpr char kCancelJob[] = "/ddp.v1.Coordinator/CancelJob";
inline constexpr char kListJobs[] = "/ddp.v1.Coordinator/ListJobs";
inline constexpr char kGetJob[] = "/ddp.v1.Coordinator/GetJob";
}  // namespace method

// The roles that may call `method`; empty for a method the table does not
// know (refused: a new RPC is closed until someone says who may call it).
std::vector<Role> RolesFor(absl::string_view method);

class Authorizer {
 public:
  // Open: every call is allowed (no --tokens_file).
  Authorizer() = default;
  explicit Authorizer(std::vector<TokenEntry> tokens);

  // Whether tokens are required.
  bool enabled() const { return enabled_; }

  // `authorization` is the call's "authorization" metadata, if it has one.
  // OK, or UNAUTHENTICATED (no token, not "Bearer <token>", a token not in
  // the file) or PERMISSION_DENIED (a known token whose role may not call
  // `method`; the message names the roles that may). Every known token is
  // compared, in constant time, whatever matches.
  absl::Status Check(absl::string_view method,
                     std::optional<absl::string_view> authorization) const;
  // The same, reading the metadata of a call.
  absl::Status Check(absl::string_view method, const grpc::ServerContextBase& context) const;
  // Who the call's token names as owner (--tokens_file owner=); empty
  // without one, or with no tokens required. Ask after Check passed.
  std::string OwnerOf(const grpc::ServerContextBase& context) const;
  // Whether the call's token may act on every owner's jobs (scope=all; and
  // every call when no tokens are required).
  bool ActsForAll(const grpc::ServerContextBase& context) const;

 private:
  const TokenEntry* EntryOf(const grpc::ServerContextBase& context) const;

  bool enabled_ = false;
  std::vector<TokenEntry> tokens_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_AUTHORIZER_H_
