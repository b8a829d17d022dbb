#include "common/local_tokens.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/net_address.h"

namespace ddp {
namespace {

constexpr Role kLocalRoles[] = {Role::kWorker, Role::kAdmin};

// Makes `dir` (0700) if missing and checks it is this user's own and
// private: a folder another user made first must not receive the tokens.
absl::Status PrivateDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("can't make ", dir, " for the local tokens: ", std::strerror(errno)));
  }
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() ||
      (st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir,
        " is not a private folder of this user's (0700, not a link): refusing to write the "
        "local tokens there; remove it, set XDG_RUNTIME_DIR, or give --tokens_file"));
  }
  return absl::OkStatus();
}

// The token in `path` if it holds one written by an earlier start.
std::string ReadToken(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[256];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return "";
  std::string token(absl::StripAsciiWhitespace(absl::string_view(buf, n)));
  return token.size() >= kMinTokenLength ? token : "";
}

absl::Status WriteToken(const std::string& path, const std::string& token) {
  const std::string temp = path + ".tmp";
  ::unlink(temp.c_str());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("can't write ", temp, ": ", std::strerror(errno)));
  }
  const std::string line = token + "\n";
  const bool written = ::fchmod(fd, 0600) == 0 &&
                       ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(fd);
  if (!written || ::rename(temp.c_str(), path.c_str()) != 0) {
    ::unlink(temp.c_str());
    return absl::FailedPreconditionError(absl::StrCat("can't write ", path));
  }
  return absl::OkStatus();
}

}  // namespace

std::string LocalTokenDir() {
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  if (runtime != nullptr && runtime[0] == '/') return absl::StrCat(runtime, "/ddp");
  return absl::StrCat("/tmp/ddp-", ::geteuid());
}

std::string LocalTokenPath(int port, Role role) {
  return absl::StrCat(LocalTokenDir(), "/coordinator-", port, "-", RoleName(role), ".token");
}

std::vector<TokenEntry> NewLocalTokens() {
  std::vector<TokenEntry> tokens;
  for (Role role : kLocalRoles)
    // One user: its tokens act on all its jobs.
    tokens.push_back({role, RandomToken(), std::string(RoleName(role)), /*scope_all=*/true});
  return tokens;
}

void RemoveLocalTokens(int port) {
  for (Role role : kLocalRoles) ::unlink(LocalTokenPath(port, role).c_str());
}

std::vector<TokenEntry> ReadLocalTokens(int port) {
  std::vector<TokenEntry> tokens;
  for (Role role : kLocalRoles) {
    std::string token = ReadToken(LocalTokenPath(port, role));
    if (token.empty()) return {};
    tokens.push_back({role, std::move(token), std::string(RoleName(role)), /*scope_all=*/true});
  }
  return tokens;
}

absl::Status WriteLocalTokens(int port, const std::vector<TokenEntry>& tokens) {
  if (absl::Status s = PrivateDir(LocalTokenDir()); !s.ok()) return s;
  for (const TokenEntry& t : tokens) {
    if (absl::Status s = WriteToken(LocalTokenPath(port, t.role), t.token); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string LocalSecretPath(const std::string& name) {
  return absl::StrCat(LocalTokenDir(), "/", name);
}

absl::StatusOr<std::string> LocalSecret(const std::string& name, size_t bytes) {
  if (absl::Status s = PrivateDir(LocalTokenDir()); !s.ok()) return s;
  const std::string path = LocalSecretPath(name);
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (std::string secret = ReadToken(path); !secret.empty()) return secret;
    // Written whole under another name, then linked into place: link()
    // never replaces, so a process that lost the race reads the winner's.
    const std::string temp = absl::StrCat(path, ".", ::getpid(), ".new");
    if (absl::Status s = WriteToken(temp, RandomToken(bytes)); !s.ok()) return s;
    const bool linked = ::link(temp.c_str(), path.c_str()) == 0;
    const int error = errno;
    ::unlink(temp.c_str());
    if (!linked && error != EEXIST) {
      return absl::FailedPreconditionError(
          absl::StrCat("can't make ", path, ": ", std::strerror(error)));
    }
  }
  if (std::string secret = ReadToken(path); !secret.empty()) return secret;
  return absl::FailedPreconditionError(absl::StrCat(path, " holds no secret: remove it"));
}

std::string FindLocalTokenFile(absl::string_view target, Role role) {
  if (!IsLocalAddress(target) || absl::StartsWith(target, "unix:")) return "";
  absl::StatusOr<HostPort> parsed = ParseHostPort(target);
  if (!parsed.ok()) return "";
  const std::string path = LocalTokenPath(parsed->port, role);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || st.st_uid != ::geteuid()) return "";
  return path;
}

}  // namespace ddp
