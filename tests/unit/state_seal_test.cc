// State in etcd is sealed with the coordinators' key: what anyone else
// wrote there (a local user, with etcd's own auth off) is refused, whatever
// it holds.
#include "common/state_seal.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using testing::HasSubstr;

const StateSeal kSeal = StateSeal::WithKey(std::string(64, 'k'));

TEST(StateSeal, SealedWithTheKey_OpensToThePayload) {
  const std::string payload("job spec \0 bytes", 16);
  absl::StatusOr<std::string> opened = kSeal.Open(kSeal.Seal(payload), "etcd key /ddp/x/state");
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(*opened, payload);
}

TEST(StateSeal, Unsealed_RefusedNamingWhere) {
  EXPECT_THAT(kSeal.Open("a job someone wrote", "etcd key /ddp/x/state"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("etcd key /ddp/x/state"), HasSubstr("not sealed"))));
}

TEST(StateSeal, OneByteChanged_Refused) {
  std::string sealed = kSeal.Seal("the state as the leader wrote it");
  sealed.back() ^= 1;
  EXPECT_THAT(kSeal.Open(sealed, "etcd key /ddp/x/state"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("MAC does not match")));
}

TEST(StateSeal, AnotherKey_Refused) {
  const StateSeal other = StateSeal::WithKey(std::string(64, 'o'));
  EXPECT_THAT(other.Open(kSeal.Seal("state"), "etcd key /ddp/x/state"),
              StatusIs(absl::StatusCode::kPermissionDenied));
}

TEST(StateSeal, KeyFile_ShortOrReadableByOthers_Refused) {
  const std::string dir = testing::TempDir() + "/state-seal-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/key";
  std::ofstream(path) << "short\n";
  ::chmod(path.c_str(), 0600);
  EXPECT_THAT(StateSeal::FromFile(path),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least 32")));
  std::ofstream(path) << std::string(64, 'a') << "\n";
  ::chmod(path.c_str(), 0644);
  EXPECT_THAT(StateSeal::FromFile(path),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("--state_key_file=" + path), HasSubstr("chmod 600"))));
  ::chmod(path.c_str(), 0600);
  absl::StatusOr<StateSeal> seal = StateSeal::FromFile(path);
  ASSERT_TRUE(seal.ok()) << seal.status();
  EXPECT_TRUE(seal->Open(StateSeal::WithKey(std::string(64, 'a')).Seal("x"), "k").ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ddp
