// A coordinator started without --tokens_file on a loopback address still
// lets no anonymous local user in: it makes a worker token and an admin
// token at start (or keeps those of an earlier coordinator on the same
// port, so that a restart strands no worker) and writes each to a file
// only its user may read, as Jupyter does:
//
//   $XDG_RUNTIME_DIR/ddp/coordinator-<port>-worker.token   (0600)
//   $XDG_RUNTIME_DIR/ddp/coordinator-<port>-admin.token
//
// (/tmp/ddp-<uid>/ without XDG_RUNTIME_DIR; the folder 0700, and refused
// unless it is the user's own and private). Workers, ddp-run, library
// programs and the test clients of the same user find them there by the
// coordinator's port. --allow_anonymous_loopback turns it off.
#ifndef DDP_COMMON_LOCAL_TOKENS_H_
#define DDP_COMMON_LOCAL_TOKENS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokens.h"

namespace ddp {

// The folder the tokens of local coordinators are in (not made here).
std::string LocalTokenDir();

// The file of `role`'s token for the coordinator serving on `port`.
std::string LocalTokenPath(int port, Role role);

// A worker token and an admin token, new.
std::vector<TokenEntry> NewLocalTokens();

// The tokens an earlier coordinator on `port` wrote (both, or none): a
// restarted coordinator keeps them, so that its workers attach again. The
// files stay after a coordinator stops, for that reason (unless the system
// picked its port: RemoveLocalTokens).
std::vector<TokenEntry> ReadLocalTokens(int port);

// Writes `tokens` to their files for `port` (0600, in the private folder,
// made if missing). FAILED_PRECONDITION when the folder is not a private
// one of this user's, or a file can't be written.
absl::Status WriteLocalTokens(int port, const std::vector<TokenEntry>& tokens);

// Removes `port`'s files: for a coordinator that served on a port the
// system picked, which no restart will serve on again.
void RemoveLocalTokens(int port);

// A secret of this user's on this machine (`name` in the private folder):
// read, or made once (`bytes` random bytes, hex; 0600) when there is none.
// Two processes making it at once end with the same one.
absl::StatusOr<std::string> LocalSecret(const std::string& name, size_t bytes);
std::string LocalSecretPath(const std::string& name);

// For a client of `target` ("127.0.0.1:PORT", "localhost:PORT") given no
// token: the path of `role`'s local token file, or "" when the target is not
// local or there is none.
std::string FindLocalTokenFile(absl::string_view target, Role role);

}  // namespace ddp

#endif  // DDP_COMMON_LOCAL_TOKENS_H_
