#include "worker/input_files.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace ddp {
namespace {

const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

absl::Status Refuse(absl::string_view field, absl::string_view path, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, " ", why));
}

// Opens `real` without following a last symbolic link or blocking on a
// FIFO, and reads it whole if it is a regular file of at most `max_bytes`
// (and, when `expected_size` is set, exactly that size).
absl::StatusOr<std::string> ReadRegular(absl::string_view field, const std::string& shown,
                                        const std::string& real, uint64_t max_bytes,
                                        const uint64_t* expected_size) {
  const int fd = ::open(real.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ELOOP) {
      return Refuse(field, shown,
                    absl::StrCat("(", real,
                                 ") is now a symbolic link; it was a file when the job "
                                 "was checked"));
    }
    return Refuse(field, shown, absl::StrCat("can't be opened: ", std::strerror(e)));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return Refuse(field, shown, absl::StrCat("can't be examined: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return Refuse(field, shown, absl::StrCat("is ", KindOf(st.st_mode), ", not a regular file"));
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    return Refuse(field, shown, absl::StrCat("has ", size, " bytes; the limit is ", max_bytes));
  }
  if (expected_size != nullptr && size != *expected_size) {
    return Refuse(field, shown,
                  absl::StrCat("has ", size, " bytes, not the ", *expected_size,
                               " it had when the job was checked: it changed since"));
  }
  std::string bytes(size, '\0');
  uint64_t got = 0;
  while (got < size) {
    const ssize_t n = ::read(fd, bytes.data() + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Refuse(field, shown, absl::StrCat("can't be read: ", std::strerror(errno)));
    if (n == 0) break;
    got += static_cast<uint64_t>(n);
  }
  char extra;
  if (got != size || ::read(fd, &extra, 1) > 0) {
    return Refuse(field, shown, "changed size while being read");
  }
  return bytes;
}

}  // namespace

std::string Sha256Hex(absl::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), length));
}

InputFiles::InputFiles(const google::protobuf::RepeatedPtrField<v1::InputFile>& pins)
    : verifying_(!pins.empty()) {
  for (const v1::InputFile& pin : pins) {
    pins_[pin.path()] = pin;
    order_.push_back(pin.path());
  }
}

absl::StatusOr<std::string> InputFiles::Read(absl::string_view field, const std::string& path,
                                             uint64_t max_bytes) {
  auto pinned = pins_.find(path);
  if (pinned == pins_.end()) {
    if (verifying_) {
      return Refuse(field, path, "was not among the files checked when the job was submitted");
    }
    // First read (the check, or an unpinned job): where the path leads now.
    std::unique_ptr<char, decltype(&::free)> real(::realpath(path.c_str(), nullptr), &::free);
    if (!real) return Refuse(field, path, absl::StrCat("can't be read: ", std::strerror(errno)));
    absl::StatusOr<std::string> bytes = ReadRegular(field, path, real.get(), max_bytes, nullptr);
    if (!bytes.ok()) return bytes.status();
    v1::InputFile pin;
    pin.set_path(path);
    pin.set_real_path(real.get());
    pin.set_size(bytes->size());
    pin.set_sha256(Sha256Hex(*bytes));
    pins_[path] = pin;
    order_.push_back(path);
    return bytes;
  }
  const v1::InputFile& pin = pinned->second;
  const uint64_t size = pin.size();
  absl::StatusOr<std::string> bytes = ReadRegular(field, path, pin.real_path(), max_bytes, &size);
  if (!bytes.ok()) return bytes.status();
  if (Sha256Hex(*bytes) != pin.sha256()) {
    return Refuse(field, path,
                  absl::StrCat("(", pin.real_path(),
                               ") holds other bytes than when the job was checked (SHA-256 ",
                               pin.sha256().substr(0, 16), "...): it was rewritten since"));
  }
  return bytes;
}

std::vector<v1::InputFile> InputFiles::Recorded() const {
  std::vector<v1::InputFile> out;
  for (const std::string& path : order_) out.push_back(pins_.at(path));
  return out;
}

}  // namespace ddp
