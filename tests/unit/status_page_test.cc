#include "coordinator/status_page.h"

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

}  // namespace
}  // namespace ddp
