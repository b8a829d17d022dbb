// The channel between a worker daemon and its job's process: whole messages
// in order, a closed end read as such, and what a hostile peer could send
// (a huge length, a cut message, bytes that don't parse) refused as data
// loss, never allocated or believed.
#include "worker/process/message_channel.h"

#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "ddp/v1/job_process.pb.h"
#include "gtest/gtest.h"

namespace ddp {
namespace {

class MessageChannelTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0); }
  void TearDown() override {
    if (fds_[1] >= 0) ::close(fds_[1]);
  }
  // Writes raw bytes from the other end, as a hostile process could.
  void Raw(const std::string& bytes) {
    ASSERT_EQ(::write(fds_[1], bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  int fds_[2] = {-1, -1};
};

TEST_F(MessageChannelTest, MessagesArriveWholeAndInOrderThenTheCloseIsSeen) {
  MessageChannel reader(fds_[0], 1 << 20);
  {
    MessageChannel writer(fds_[1], 1 << 20);
    fds_[1] = -1;  // the writer owns it now
    for (int i = 1; i <= 3; ++i) {
      v1::ToJobProcess m;
      m.set_abort_any("reason " + std::to_string(i));
      ASSERT_TRUE(writer.Send(m).ok());
    }
    writer.CloseWrite();
  }
  for (int i = 1; i <= 3; ++i) {
    v1::ToJobProcess m;
    absl::StatusOr<bool> got = reader.Receive(&m);
    ASSERT_TRUE(got.ok() && *got) << got.status();
    EXPECT_EQ(m.abort_any(), "reason " + std::to_string(i));
  }
  v1::ToJobProcess m;
  absl::StatusOr<bool> got = reader.Receive(&m);
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(*got) << "the peer closed between messages";
}

TEST_F(MessageChannelTest, ALengthOverTheBoundIsRefusedNotAllocated) {
  MessageChannel reader(fds_[0], 1024);
  Raw(std::string("\xff\xff\xff\x7f", 4));  // 2 GiB claimed
  v1::FromJobProcess m;
  absl::StatusOr<bool> got = reader.Receive(&m);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  EXPECT_NE(got.status().message().find("at most 1024"), std::string::npos) << got.status();
}

TEST_F(MessageChannelTest, ACutOrUnparsableMessageIsDataLoss) {
  MessageChannel reader(fds_[0], 1024);
  Raw(std::string("\x04\x00\x00\x00\xff\xff\xff\xff", 8));  // 4 bytes that don't parse
  v1::FromJobProcess m;
  EXPECT_EQ(reader.Receive(&m).status().code(), absl::StatusCode::kDataLoss);
  Raw(std::string("\x10\x00\x00\x00\x0a", 5));  // 16 announced, 1 sent, then closed
  ::close(fds_[1]);
  fds_[1] = -1;
  EXPECT_EQ(reader.Receive(&m).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(MessageChannelTest, SendingToAClosedPeerIsAnErrorNotSigpipe) {
  MessageChannel writer(fds_[0], 1024);
  ::close(fds_[1]);
  fds_[1] = -1;
  v1::ToJobProcess m;
  m.set_abort_any(std::string(1 << 16, 'x'));
  EXPECT_FALSE(writer.Send(m).ok());
}

}  // namespace
}  // namespace ddp
