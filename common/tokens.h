// Bearer tokens and the roles they carry: the coordinator's --tokens_file
// format, random secrets, and a comparison whose time says nothing about
// how much of a guess was right. No gRPC here: the coordinator's core uses
// it for the store's per-generation tokens.
//
// A tokens file has one "<role> <token> [owner=NAME] [max_workers=N]
// [max_queued=N] [max_priority=N] [scope=all]" per line; roles are worker,
// operator and admin; '#' starts a comment; blank lines are skipped. The
// owner is who the jobs a token submits belong to (default: the role's
// name). An owner's limits, given on any one of its lines: max_workers, the
// most workers its jobs may hold together (default: no limit); max_queued,
// the most of its jobs waiting in the queue (default: a fair share of the
// queue among the owners the file names); max_priority, the highest
// priority its jobs may have (default: 0, the default priority, so that an
// owner can't preempt another's jobs unless allowed to). scope=all: the
// token may act on every owner's jobs (cancel them), not only its owner's:
//
//   # role     token                             owner and limits
//   worker     3f9c0d7e6b1a4c2f8e5d9a0b7c6e1f2a
//   admin      5e4f30211f2e3d4c5b6a79809b8a7c6d  owner=alice max_workers=8 max_queued=10
//   admin      9b8a7c6d5e4f30211f2e3d4c5b6a7980  owner=ops scope=all max_priority=100
//
// Thread-safe: everything here is a pure function.
#ifndef DDP_COMMON_TOKENS_H_
#define DDP_COMMON_TOKENS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ddp {

// What a token may do. An admin may do everything an operator may; a
// worker's rights are its own (attach, and the store of its generation).
enum class Role { kWorker, kOperator, kAdmin };

absl::string_view RoleName(Role role);
std::optional<Role> ParseRole(absl::string_view name);

struct TokenEntry {
  Role role;
  std::string token;
  // Who the jobs this token submits belong to ("": nobody named).
  std::string owner = {};
  // scope=all: acts on every owner's jobs, not only its owner's.
  bool scope_all = false;
};

// The most workers each owner's jobs may hold together: the owners a tokens
// file gives a max_workers.
using OwnerQuotas = std::map<std::string, uint32_t>;

// An owner's other limits, where the tokens file gives them.
struct OwnerLimits {
  std::optional<uint32_t> max_queued;
  std::optional<int32_t> max_priority;
};

struct TokensFile {
  std::vector<TokenEntry> tokens;
  OwnerQuotas quotas;
  // Every owner the file names (a line of its), with the limits it gives.
  std::map<std::string, OwnerLimits> limits;
};

// Shortest token a tokens file may hold: anything shorter is guessable.
inline constexpr size_t kMinTokenLength = 16;

// Parses a tokens file's text. INVALID_ARGUMENT names the line: an unknown
// role, a line without a role and a token, an unknown or malformed
// key=value, a token shorter than kMinTokenLength, the same token twice, an
// owner given two different quotas; also when no line holds a token.
// Messages never quote a token.
absl::StatusOr<TokensFile> ParseTokens(absl::string_view text);

// Reads and parses `path`; errors start with "<flag>=<path>: ". A file that
// other users may read is refused (INVALID_ARGUMENT, saying to chmod it) as
// ssh refuses such a key, unless `allow_readable` (then it is a warning):
// any access by others, or by the group when the file is the reader's own
// (root:ddp 0640, an administrator's grant to the daemons' group, is read).
absl::StatusOr<TokensFile> LoadTokensFile(const std::string& flag, const std::string& path,
                                          bool allow_readable = false);

// Reads a client's token file: one token, surrounding white space and
// '#' comment lines ignored. Errors start with "<flag>=<path>: ". One that
// others may read draws a warning: it holds one client's token.
absl::StatusOr<std::string> LoadTokenFile(const std::string& flag, const std::string& path);
// The same for a secret the coordinators share (--state_key_file, etcd's
// password): refused when others may read it.
absl::StatusOr<std::string> LoadSecretFile(const std::string& flag, const std::string& path);
absl::StatusOr<std::string> LoadOneSecret(const std::string& flag, const std::string& path,
                                          bool refuse_readable);

// `bytes` random bytes from the operating system's generator, as lowercase
// hex (2 * bytes characters).
std::string RandomToken(size_t bytes = 16);

// Whether a == b, in time that depends on neither's contents nor on where
// they first differ: both are hashed to fixed-length SHA-256 digests, which
// are compared with CRYPTO_memcmp (no early exit on the first difference).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// The role of `token` among `tokens`, if it is one of them. Compares with
// every entry, matched or not: the time taken says nothing about which (or
// whether one) matched, nor how much of a guess was right.
std::optional<Role> FindTokenRole(const std::vector<TokenEntry>& tokens, absl::string_view token);
// The same, giving the whole entry (its owner too); nullptr when none.
const TokenEntry* FindToken(const std::vector<TokenEntry>& tokens, absl::string_view token);

}  // namespace ddp

#endif  // DDP_COMMON_TOKENS_H_
