#include "common/state_seal.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/local_tokens.h"
#include "common/tokens.h"

namespace ddp {
namespace {

constexpr absl::string_view kMagic = "ddp-state-seal-1\n";
constexpr size_t kMacBytes = 32;
constexpr size_t kMinKeyLength = 32;

}  // namespace

absl::StatusOr<StateSeal> StateSeal::FromFile(const std::string& path) {
  // A token file's rules: one secret, and refused when others may read it.
  absl::StatusOr<std::string> key = LoadSecretFile("--state_key_file", path);
  if (!key.ok()) return key.status();
  if (key->size() < kMinKeyLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--state_key_file=", path, ": the key is ", key->size(), " characters; give at least ",
        kMinKeyLength, " (e.g. openssl rand -hex 32 > ", path, "; chmod 600 ", path, ")"));
  }
  return StateSeal(*std::move(key), path);
}

absl::StatusOr<StateSeal> StateSeal::LocalDefault() {
  absl::StatusOr<std::string> key = LocalSecret("state.key", 32);
  if (!key.ok()) return key.status();
  return StateSeal(*std::move(key), LocalSecretPath("state.key"));
}

std::string StateSeal::Mac(absl::string_view payload) const {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()),
       reinterpret_cast<const unsigned char*>(payload.data()), payload.size(), mac, &length);
  return std::string(reinterpret_cast<const char*>(mac), length);
}

std::string StateSeal::Seal(absl::string_view payload) const {
  return absl::StrCat(kMagic, Mac(payload), payload);
}

absl::StatusOr<std::string> StateSeal::Open(absl::string_view sealed,
                                            absl::string_view where) const {
  if (!absl::StartsWith(sealed, kMagic) || sealed.size() < kMagic.size() + kMacBytes) {
    return absl::PermissionDeniedError(absl::StrCat(
        where, " is not sealed by a coordinator (no MAC): written by someone else; refusing it"));
  }
  const absl::string_view mac = sealed.substr(kMagic.size(), kMacBytes);
  const absl::string_view payload = sealed.substr(kMagic.size() + kMacBytes);
  const std::string expected = Mac(payload);
  if (CRYPTO_memcmp(mac.data(), expected.data(), kMacBytes) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        where, "'s MAC does not match the key in ", source_,
        ": written by someone without it (or by coordinators with another key); refusing it"));
  }
  return std::string(payload);
}

}  // namespace ddp
