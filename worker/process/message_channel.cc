#include "worker/process/message_channel.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/message_lite.h"

namespace ddp {
namespace {

absl::Status WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Reads exactly `size` bytes: the count read before the peer closed, or
// -1 on an error.
ssize_t ReadAll(int fd, char* data, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return static_cast<ssize_t>(done);
}

}  // namespace

MessageChannel::MessageChannel(int fd, size_t max_read_bytes)
    : fd_(fd), max_read_bytes_(max_read_bytes) {}

MessageChannel::~MessageChannel() { ::close(fd_); }

absl::Status MessageChannel::Send(const google::protobuf::MessageLite& message) {
  const size_t size = message.ByteSizeLong();
  if (size > UINT32_MAX) return absl::InvalidArgumentError("message over 4 GiB");
  std::string frame(4 + size, '\0');
  const auto length = static_cast<uint32_t>(size);
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  if (!message.SerializeToArray(frame.data() + 4, static_cast<int>(size))) {
    return absl::InternalError("can't serialize a message");
  }
  absl::MutexLock lock(&send_mu_);
  if (write_closed_) return absl::FailedPreconditionError("the channel is closed for sending");
  return WriteAll(fd_, frame.data(), frame.size());
}

absl::StatusOr<bool> MessageChannel::Receive(google::protobuf::MessageLite* message) {
  unsigned char header[4];
  const ssize_t got = ReadAll(fd_, reinterpret_cast<char*>(header), sizeof(header));
  if (got < 0) return absl::UnavailableError(absl::StrCat("read: ", std::strerror(errno)));
  if (got == 0) return false;
  if (got < 4) return absl::DataLossError("the peer closed inside a message's length");
  const uint32_t length =
      header[0] | (header[1] << 8) | (header[2] << 16) | (static_cast<uint32_t>(header[3]) << 24);
  if (length > max_read_bytes_) {
    return absl::DataLossError(absl::StrCat("a message of ", length, " bytes (at most ",
                                            max_read_bytes_, " are accepted)"));
  }
  std::string body(length, '\0');
  const ssize_t read = ReadAll(fd_, body.data(), length);
  if (read < 0) return absl::UnavailableError(absl::StrCat("read: ", std::strerror(errno)));
  if (static_cast<size_t>(read) < length) {
    return absl::DataLossError("the peer closed inside a message");
  }
  if (!message->ParseFromString(body)) return absl::DataLossError("a message that doesn't parse");
  return true;
}

void MessageChannel::CloseWrite() {
  absl::MutexLock lock(&send_mu_);
  if (write_closed_) return;
  write_closed_ = true;
  ::shutdown(fd_, SHUT_WR);
}

}  // namespace ddp
