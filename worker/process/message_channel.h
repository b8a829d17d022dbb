// Protobuf messages over a stream socket, each a 4-byte little-endian
// length and the message: how a ddp-worker daemon and its job's process
// talk. What is read is bounded (a larger length is an error, not an
// allocation), so either side may treat the other as untrusted.
#ifndef DDP_WORKER_PROCESS_MESSAGE_CHANNEL_H_
#define DDP_WORKER_PROCESS_MESSAGE_CHANNEL_H_

#include <cstddef>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace google::protobuf {
class MessageLite;
}

namespace ddp {

class MessageChannel {
 public:
  // Owns `fd`; refuses to read a message over `max_read_bytes`.
  MessageChannel(int fd, size_t max_read_bytes);
  ~MessageChannel();
  MessageChannel(const MessageChannel&) = delete;
  MessageChannel& operator=(const MessageChannel&) = delete;

  // Writes one whole message (a broken pipe is an error, never SIGPIPE).
  // Thread-safe: concurrent sends never interleave.
  absl::Status Send(const google::protobuf::MessageLite& message);
  // Reads the next message: true, or false when the peer closed its end
  // between messages. DATA_LOSS for a cut, oversized or unparsable one.
  // One reader at a time.
  absl::StatusOr<bool> Receive(google::protobuf::MessageLite* message);
  // Says no more will be sent (the peer's Receive then returns false).
  void CloseWrite();

 private:
  const int fd_;
  const size_t max_read_bytes_;
  absl::Mutex send_mu_;
  bool write_closed_ ABSL_GUARDED_BY(send_mu_) = false;
};

}  // namespace ddp

#endif  // DDP_WORKER_PROCESS_MESSAGE_CHANNEL_H_
