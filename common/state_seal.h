// The coordinators' state as they write it to etcd, sealed: an HMAC-SHA256
// of the bytes keyed by a secret only the coordinators hold, so that state
// anyone else wrote (a local user, where etcd's own authentication is off)
// is refused rather than run.
//
//   "ddp-state-seal-1\n" + 32-byte HMAC-SHA256(key, payload) + payload
//
// The key is a file like a token (--state_key_file: one secret of at least
// 32 characters, refused when others may read it), or, without the flag,
// made once per user and machine in the local tokens' private folder
// (common/local_tokens.h), which two coordinators of the same user on one
// machine share; coordinators on other machines are given a copy.
#ifndef DDP_COMMON_STATE_SEAL_H_
#define DDP_COMMON_STATE_SEAL_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ddp {

class StateSeal {
 public:
  // The key in `path` (flag --state_key_file).
  static absl::StatusOr<StateSeal> FromFile(const std::string& path);
  // This user's key on this machine, made (0600) if there is none yet.
  static absl::StatusOr<StateSeal> LocalDefault();
  // A key given as is (tests).
  static StateSeal WithKey(std::string key) { return StateSeal(std::move(key)); }

  std::string Seal(absl::string_view payload) const;
  // The payload of what Seal wrote with the same key. PERMISSION_DENIED
  // when the seal is missing or does not match (written by someone without
  // the key, or with another key); the messages name `where`.
  absl::StatusOr<std::string> Open(absl::string_view sealed, absl::string_view where) const;

  // Where the key came from, for messages.
  const std::string& source() const { return source_; }

 private:
  explicit StateSeal(std::string key, std::string source = "a key given")
      : key_(std::move(key)), source_(std::move(source)) {}
  std::string Mac(absl::string_view payload) const;

  std::string key_;
  std::string source_;
};

}  // namespace ddp

#endif  // DDP_COMMON_STATE_SEAL_H_
