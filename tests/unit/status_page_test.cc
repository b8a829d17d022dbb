#include "coordinator/status_page.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

class StatusPageTest : public testing::Test {
 protected:
  StatusPageTest() {
    auto s = std::make_shared<v1::JobStatus>();
    s->set_job_id("job-7");
    s->set_state(v1::JOB_STATE_RUNNING);
    v1::WorkerStatus* w = s->add_workers();
    w->set_worker_id("w0");
    w->set_rank(0);
    w->set_step(3);
    w->set_state(v1::WORKER_STATE_TRAINING);
    w->mutable_timings()->set_forward_ms(4.5);
    status_ = s;
    history_.Record(*status_);
  }

  FakeClock clock_;
  std::shared_ptr<const v1::JobStatus> status_;
  StatusHistory history_{&clock_, {}};
  StatusPageHandler handler_{[this] { return status_; }, &history_, &clock_};
};

TEST_F(StatusPageTest, Respond_Page_ServesEmbeddedHtmlScriptAndStyle) {
  const HttpResponse page = handler_.Respond("GET", "/");
  EXPECT_EQ(page.code, 200);
  EXPECT_THAT(page.content_type, StartsWith("text/html"));
  EXPECT_THAT(page.body, HasSubstr("<script src=\"/status.js\""));
  EXPECT_THAT(handler_.Respond("GET", "/status.js").content_type, StartsWith("text/javascript"));
  EXPECT_THAT(handler_.Respond("GET", "/status.js").body, HasSubstr("/api/status"));
  EXPECT_THAT(handler_.Respond("HEAD", "/status.css").content_type, StartsWith("text/css"));
}

TEST_F(StatusPageTest, Respond_ApiStatus_SnapshotWithDefaultsAndHistory) {
  const HttpResponse api = handler_.Respond("GET", "/api/status");
  ASSERT_EQ(api.code, 200);
  EXPECT_EQ(api.content_type, "application/json");
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(api.body, &parsed).ok()) << api.body;
  const auto& status = parsed.fields().at("status").struct_value().fields();
  EXPECT_EQ(status.at("jobId").string_value(), "job-7");
  EXPECT_EQ(status.at("state").string_value(), "JOB_STATE_RUNNING");
  // Zeros are printed too: the page reads every field.
  EXPECT_EQ(status.at("globalStep").string_value(), "0");
  const auto& worker = status.at("workers").list_value().values(0).struct_value().fields();
  EXPECT_EQ(worker.at("timings").struct_value().fields().at("forwardMs").number_value(), 4.5);
  const auto& history = parsed.fields().at("history").struct_value().fields();
  EXPECT_EQ(history.at("ranks").list_value().values_size(), 1);
  EXPECT_EQ(parsed.fields().at("now_unix_seconds").number_value(),
            absl::ToDoubleSeconds(clock_.Now() - absl::UnixEpoch()));
}

TEST_F(StatusPageTest, Respond_UnknownPathOrMethod_404Or405) {
  EXPECT_EQ(handler_.Respond("GET", "/etc/passwd").code, 404);
  EXPECT_EQ(handler_.Respond("GET", "/status.js/").code, 404);
  EXPECT_EQ(handler_.Respond("POST", "/api/status").code, 405);
}

// A raw HTTP exchange: what a browser sends, nothing more.
std::string Fetch(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string answer;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) answer.append(buf, n);
  ::close(fd);
  return answer;
}

TEST_F(StatusPageTest, Server_PortZero_ServesApiWithSecurityHeaders) {
  auto server = StatusPageServer::Start({"127.0.0.1:0"}, &handler_);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  const std::string answer =
      Fetch((*server)->port(), "GET /api/status HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(answer, HasSubstr("Content-Security-Policy: default-src 'none'"));
  EXPECT_THAT(answer, HasSubstr("\"jobId\":\"job-7\""));
  EXPECT_THAT(Fetch((*server)->port(), "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"),
              StartsWith("HTTP/1.1 404"));
}

TEST_F(StatusPageTest, Server_OversizedRequest_NotServed) {
  StatusPageServer::Options options{"127.0.0.1:0"};
  options.max_request_bytes = 1024;
  auto server = StatusPageServer::Start(options, &handler_);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string big =
      "GET /api/status HTTP/1.1\r\nHost: x\r\nX-Pad: " + std::string(4096, 'a') + "\r\n\r\n";
  EXPECT_THAT(Fetch((*server)->port(), big), ::testing::Not(HasSubstr("job-7")));
}

TEST_F(StatusPageTest, Server_AddressInUseOrNotAnAddress_Refused) {
  auto first = StatusPageServer::Start({"127.0.0.1:0"}, &handler_);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(StatusPageServer::Start({"127.0.0.1:" + std::to_string((*first)->port())}, &handler_)
                  .status(),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(StatusPageServer::Start({"example.com:80"}, &handler_).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("IP address")));
}

}  // namespace
}  // namespace ddp
