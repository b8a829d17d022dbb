#include "coordinator/file_state_store.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/ddp-state-test-XXXXXX";
  return ::mkdtemp(tmpl);
}

TEST(FileStateStore, SaveLoad_RoundTrip) {
  auto store = FileStateStore::Open(TempDir());
  ASSERT_THAT(store, IsOk());
  auto empty = (*store)->Load();
  ASSERT_THAT(empty, IsOk());
  EXPECT_FALSE(empty->has_value());
  v1::DurableState state;
  state.mutable_job()->set_name("j");
  state.set_latest_generation(7);
  ASSERT_THAT((*store)->Save(state, 1), IsOk());
  auto loaded = (*store)->Load();
  ASSERT_THAT(loaded, IsOk());
  ASSERT_TRUE(loaded->has_value());
  EXPECT_EQ((*loaded)->latest_generation(), 7u);
  EXPECT_EQ((*loaded)->job().name(), "j");
}

TEST(FileStateStore, Save_OlderSequence_Skipped) {
  auto store = *FileStateStore::Open(TempDir());
  v1::DurableState newer, older;
  newer.set_latest_generation(2);
  older.set_latest_generation(1);
  ASSERT_THAT(store->Save(newer, 5), IsOk());
  ASSERT_THAT(store->Save(older, 4), IsOk());
  EXPECT_EQ((*store->Load())->latest_generation(), 2u);
}

TEST(FileStateStore, Load_CorruptFile_DataLoss) {
  const std::string dir = TempDir();
  std::ofstream(dir + "/coordinator.state") << "\xff\xff\xff garbage";
  auto store = *FileStateStore::Open(dir);
  EXPECT_THAT(store->Load(), StatusIs(absl::StatusCode::kDataLoss));
}

TEST(FileStateStore, Open_Unwritable_FailedPrecondition) {
  EXPECT_THAT(FileStateStore::Open("/proc/ddp-no-such-dir"),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(FileStateStore, Open_SecondCoordinatorOnTheFolder_RefusedNamingTheFirst) {
  const std::string dir = TempDir();
  auto first = FileStateStore::Open(dir);
  ASSERT_THAT(first, IsOk());
  auto second = FileStateStore::Open(dir);
  EXPECT_THAT(second, StatusIs(absl::StatusCode::kFailedPrecondition,
                               ::testing::AllOf(
                                   ::testing::HasSubstr("in use by another coordinator"),
                                   ::testing::HasSubstr(absl::StrCat("(pid ", ::getpid(), ")")))));
  // The first one's state is untouched by the refusal.
  v1::DurableState state;
  state.set_latest_generation(3);
  ASSERT_THAT((*first)->Save(state, 1), IsOk());
  first->reset();
  // Gone (as a process that exits): the folder is free again.
  auto third = FileStateStore::Open(dir);
  ASSERT_THAT(third, IsOk());
  EXPECT_EQ((*(*third)->Load())->latest_generation(), 3u);
}

}  // namespace
}  // namespace ddp
