#include "coordinator/worker_pages.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::JobStatus Workers(int n) {
  v1::JobStatus status;
  // Listed out of order, as a registry might hold them.
  for (int i = n - 1; i >= 0; --i) {
    v1::WorkerStatus* w = status.add_workers();
    w->set_worker_id(absl::StrCat("w", i));
    w->set_host(absl::StrCat("host-", i / 4));
    w->set_device(absl::StrCat("cpu:", i % 4));
    w->set_rank(i % 2 == 0 ? i / 2 : -1);
    w->set_state(i % 3 == 0 ? v1::WORKER_STATE_IDLE : v1::WORKER_STATE_TRAINING);
  }
  return status;
}

std::vector<std::string> Ids(const v1::ListWorkersResponse& page) {
  std::vector<std::string> ids;
  for (const auto& w : page.workers()) ids.push_back(w.worker_id());
  return ids;
}

// Every page in turn; the ids in the order they came.
std::vector<std::string> AllPages(const v1::JobStatus& status, v1::ListWorkersRequest request) {
  std::vector<std::string> ids;
  for (int pages = 0; pages < 1000; ++pages) {
    absl::StatusOr<v1::ListWorkersResponse> page = PageOfWorkers(status, request);
    EXPECT_THAT(page, IsOk());
    if (!page.ok()) break;
    for (const std::string& id : Ids(*page)) ids.push_back(id);
    if (page->next_page_token().empty()) break;
    request.set_page_token(page->next_page_token());
  }
  return ids;
}

TEST(WorkerPages, SmallList_OnePage_OrderedByHostDevice) {
  absl::StatusOr<v1::ListWorkersResponse> page = PageOfWorkers(Workers(5), {});
  ASSERT_THAT(page, IsOk());
  EXPECT_THAT(Ids(*page), ElementsAre("w0", "w1", "w2", "w3", "w4"));
  EXPECT_EQ(page->total_size(), 5u);
  EXPECT_EQ(page->next_page_token(), "");
}

TEST(WorkerPages, ManyWorkers_DefaultPageIs100_PagesCoverEveryWorkerOnce) {
  const v1::JobStatus status = Workers(4096);
  absl::StatusOr<v1::ListWorkersResponse> first = PageOfWorkers(status, {});
  ASSERT_THAT(first, IsOk());
  EXPECT_EQ(first->workers_size(), 100);
  EXPECT_EQ(first->total_size(), 4096u);
  EXPECT_NE(first->next_page_token(), "");
  v1::ListWorkersRequest request;
  request.set_page_size(333);
  const std::vector<std::string> ids = AllPages(status, request);
  ASSERT_EQ(ids.size(), 4096u);
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), 4096u);
}

TEST(WorkerPages, PageSizeOver1000_Clamped) {
  v1::ListWorkersRequest request;
  request.set_page_size(50000);
  absl::StatusOr<v1::ListWorkersResponse> page = PageOfWorkers(Workers(4096), request);
  ASSERT_THAT(page, IsOk());
  EXPECT_EQ(page->workers_size(), 1000);
}

TEST(WorkerPages, Filters_StateAndMembersOnly) {
  v1::ListWorkersRequest request;
  request.set_state(v1::WORKER_STATE_IDLE);
  request.set_members_only(true);
  request.set_page_size(2);
  const std::vector<std::string> ids = AllPages(Workers(13), request);
  // Idle (i % 3 == 0) members (i even): 0, 6, 12.
  EXPECT_THAT(ids, ElementsAre("w0", "w6", "w12"));  // by host: host-0, host-1, host-3
}

TEST(WorkerPages, WorkerGoneBetweenPages_NothingRepeatedOrSkipped) {
  v1::JobStatus status = Workers(10);
  v1::ListWorkersRequest request;
  request.set_page_size(4);
  absl::StatusOr<v1::ListWorkersResponse> first = PageOfWorkers(status, request);
  ASSERT_THAT(first, IsOk());
  // The last worker handed out leaves before the next page is asked for.
  v1::JobStatus after;
  for (const auto& w : status.workers()) {
    if (w.worker_id() != first->workers(3).worker_id()) *after.add_workers() = w;
  }
  request.set_page_token(first->next_page_token());
  std::vector<std::string> ids = Ids(*first);
  for (const std::string& id : AllPages(after, request)) ids.push_back(id);
  EXPECT_EQ(ids.size(), 10u);
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), 10u);
}

TEST(WorkerPages, ForeignToken_InvalidArgumentSaysWhatToPass) {
  v1::ListWorkersRequest request;
  request.set_page_token("not-a-token");
  EXPECT_THAT(PageOfWorkers(Workers(3), request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("next_page_token")));
}

}  // namespace
}  // namespace ddp
