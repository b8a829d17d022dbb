#include "common/tokens.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"

namespace ddp {
namespace {

// Bounds what a start-up reads: a tokens file is a few lines.
constexpr size_t kMaxFileBytes = 1 << 20;

// Who else may read `st`'s file, as ssh judges a private key: any access by
// others; by the group too when the file is ours (a file root owns and lets
// our group read, root:ddp 0640 as the systemd units install it, is an
// administrator's deliberate grant). Empty when no one else may.
std::string ReadableByOthers(const struct stat& st) {
  if (st.st_mode & 007) return "other users";
  if ((st.st_mode & 070) && st.st_uid == ::geteuid()) return "its group";
  return "";
}

// `refuse_readable`: a file others may read is an error (else a warning).
absl::StatusOr<std::string> ReadSecretFile(const std::string& flag, const std::string& path,
                                           bool refuse_readable) {
  const std::string where = absl::StrCat(flag, "=", path, ": ");
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(where + "not a regular file");
  if (static_cast<size_t>(st.st_size) > kMaxFileBytes) {
    return absl::InvalidArgumentError(where + "larger than 1 MiB; not a token file");
  }
  if (const std::string who = ReadableByOthers(st); !who.empty()) {
    const std::string mode = absl::StrFormat("%03o", st.st_mode & 0777);
    if (refuse_readable) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, who, " may read it (mode ", mode,
          "), and anyone who reads it holds its secrets: chmod 600 it (or 640 owned by root "
          "with the daemon's group)",
          absl::EndsWith(flag, "tokens_file") ? ", or pass --allow_readable_tokens" : ""));
    }
    DDP_LOG(Warning) << where << who << " may read it (mode " << mode << "); chmod 600 it";
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(where, std::strerror(errno)));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kWorker:
      return "worker";
    case Role::kOperator:
      return "operator";
    case Role::kAdmin:
      return "admin";
  }
  return "unknown";
}

std::optional<Role> ParseRole(absl::string_view name) {
  for (Role r : {Role::kWorker, Role::kOperator, Role::kAdmin}) {
    if (name == RoleName(r)) return r;
  }
  return std::nullopt;
}

namespace {

// What one line gives its owner.
struct LineLimits {
  std::optional<uint32_t> max_workers;
  OwnerLimits limits;
};

// Takes one "key=value" of a line into `entry` (owner, scope) or `*line`.
absl::Status ParseOption(absl::string_view field, TokenEntry* entry, LineLimits* line) {
  const size_t eq = field.find('=');
  const absl::string_view key = field.substr(0, eq);
  const absl::string_view value = eq == absl::string_view::npos ? "" : field.substr(eq + 1);
  if (key == "owner" && !value.empty() && value.size() <= 64) {
    entry->owner = std::string(value);
    return absl::OkStatus();
  }
  if (key == "scope" && value == "all") {
    entry->scope_all = true;
    return absl::OkStatus();
  }
  uint32_t n = 0;
  int32_t priority = 0;
  if (key == "max_workers" && absl::SimpleAtoi(value, &n) && n > 0) {
    line->max_workers = n;
    return absl::OkStatus();
  }
  if (key == "max_queued" && absl::SimpleAtoi(value, &n) && n > 0) {
    line->limits.max_queued = n;
    return absl::OkStatus();
  }
  if (key == "max_priority" && absl::SimpleAtoi(value, &priority)) {
    line->limits.max_priority = priority;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "\"", absl::CHexEscape(field.substr(0, 40)),
      "\" is not owner=NAME (1 to 64 characters), max_workers=N or max_queued=N (a positive "
      "number), max_priority=N (a number) or scope=all"));
}

// Adds `value` as the owner's `what` unless an earlier line gave another.
template <typename T>
absl::Status OneValue(const std::string& owner, const char* what, std::optional<T>* have,
                      const std::optional<T>& value) {
  if (!value) return absl::OkStatus();
  if (*have && **have != *value) {
    return absl::InvalidArgumentError(absl::StrCat("owner \"", owner, "\" was given ", what, "=",
                                                   **have,
                                                   " on an earlier line; give an owner "
                                                   "one ",
                                                   what));
  }
  *have = value;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokensFile> ParseTokens(absl::string_view text) {
  TokensFile file;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    const std::string where = absl::StrCat("line ", line_number, ": ");
    if (fields.size() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       "expected \"<role> <token> [owner=NAME] [max_workers=N]\" (role worker, "
                       "operator or admin), got ",
                       fields.size(), " field(s)"));
    }
    std::optional<Role> role = ParseRole(fields[0]);
    if (!role) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "unknown role \"", absl::CHexEscape(fields[0].substr(0, 20)),
                       "\"; the roles are worker, operator and admin"));
    }
    if (fields[1].size() < kMinTokenLength) {
      return absl::InvalidArgumentError(absl::StrCat(where, "the token is ", fields[1].size(),
                                                     " characters; use at least ", kMinTokenLength,
                                                     " random ones (openssl rand -hex 16)"));
    }
    for (const TokenEntry& e : file.tokens) {
      if (e.token == fields[1]) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "the same token is listed twice; give each role its own"));
      }
    }
    TokenEntry entry{*role, std::string(fields[1]), std::string(RoleName(*role))};
    LineLimits line_limits;
    for (size_t i = 2; i < fields.size(); ++i) {
      if (absl::Status s = ParseOption(fields[i], &entry, &line_limits); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(where, s.message()));
      }
    }
    if (const std::optional<uint32_t>& max_workers = line_limits.max_workers) {
      auto [it, added] = file.quotas.emplace(entry.owner, *max_workers);
      if (!added && it->second != *max_workers) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "owner \"", entry.owner, "\" was given max_workers=", it->second,
                         " on an earlier line; give an owner one quota"));
      }
    }
    // Workers own no jobs: their lines name no owner of jobs.
    if (entry.role != Role::kWorker) {
      OwnerLimits& limits = file.limits[entry.owner];
      absl::Status s =
          OneValue(entry.owner, "max_queued", &limits.max_queued, line_limits.limits.max_queued);
      if (s.ok()) {
        s = OneValue(entry.owner, "max_priority", &limits.max_priority,
                     line_limits.limits.max_priority);
      }
      if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(where, s.message()));
    }
    file.tokens.push_back(std::move(entry));
  }
  if (file.tokens.empty()) {
    return absl::InvalidArgumentError("no \"<role> <token>\" line: every call would be refused");
  }
  return file;
}

absl::StatusOr<TokensFile> LoadTokensFile(const std::string& flag, const std::string& path,
                                          bool allow_readable) {
  absl::StatusOr<std::string> text = ReadSecretFile(flag, path, !allow_readable);
  if (!text.ok()) return text.status();
  absl::StatusOr<TokensFile> file = ParseTokens(*text);
  if (!file.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, ": ", file.status().message()));
  }
  return file;
}

absl::StatusOr<std::string> LoadTokenFile(const std::string& flag, const std::string& path) {
  return LoadOneSecret(flag, path, /*refuse_readable=*/false);
}

absl::StatusOr<std::string> LoadSecretFile(const std::string& flag, const std::string& path) {
  return LoadOneSecret(flag, path, /*refuse_readable=*/true);
}

absl::StatusOr<std::string> LoadOneSecret(const std::string& flag, const std::string& path,
                                          bool refuse_readable) {
  absl::StatusOr<std::string> text = ReadSecretFile(flag, path, refuse_readable);
  if (!text.ok()) return text.status();
  std::string token;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    if (!token.empty() || line.find_first_of(" \t") != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, "=", path, ": holds more than one token; put only this client's token in it"));
    }
    token = std::string(line);
  }
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, ": holds no token"));
  }
  return token;
}

std::string RandomToken(size_t bytes) {
  std::string raw(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), static_cast<int>(bytes)) != 1) {
    // OpenSSL's generator failing means no secret can be made safely.
    DDP_LOG(Error) << "the random number generator failed; can't make a token";
    std::abort();
  }
  return absl::BytesToHexString(raw);
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  unsigned char da[SHA256_DIGEST_LENGTH];
  unsigned char db[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(a.data()), a.size(), da);
  SHA256(reinterpret_cast<const unsigned char*>(b.data()), b.size(), db);
  return CRYPTO_memcmp(da, db, SHA256_DIGEST_LENGTH) == 0;
}

const TokenEntry* FindToken(const std::vector<TokenEntry>& tokens, absl::string_view token) {
  const TokenEntry* found = nullptr;
  for (const TokenEntry& entry : tokens) {
    if (ConstantTimeEquals(entry.token, token)) found = &entry;
  }
  return found;
}

std::optional<Role> FindTokenRole(const std::vector<TokenEntry>& tokens, absl::string_view token) {
  const TokenEntry* entry = FindToken(tokens, token);
  return entry ? std::optional<Role>(entry->role) : std::nullopt;
}

}  // namespace ddp
