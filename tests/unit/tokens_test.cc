// The tokens file format, client token files, random tokens and the
// constant-time comparison.
#include "common/tokens.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <utility>
#include <vector>

#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(ParseTokens, RolesCommentsAndBlankLines_Parsed) {
  auto entries = ParseTokens(
      "# role token\n"
      "\n"
      "worker   0123456789abcdef0123\n"
      "\toperator\t0123456789abcdef0124   # the dashboard\r\n"
      "admin 0123456789abcdef0125\n");
  ASSERT_THAT(entries, IsOk());
  const std::vector<TokenEntry>& tokens = entries->tokens;
  ASSERT_EQ(tokens.size(), 3u);
  EXPECT_EQ(tokens[0].role, Role::kWorker);
  EXPECT_EQ(tokens[0].token, "0123456789abcdef0123");
  EXPECT_EQ(tokens[1].role, Role::kOperator);
  EXPECT_EQ(tokens[1].token, "0123456789abcdef0124");
  EXPECT_EQ(tokens[2].role, Role::kAdmin);
  // Without owner=, a token's jobs belong to its role; nobody has a quota.
  EXPECT_EQ(tokens[1].owner, "operator");
  EXPECT_TRUE(entries->quotas.empty());
}

TEST(ParseTokens, OwnersAndQuotas_OneQuotaPerOwnerOnAnyOfItsLines) {
  auto file = ParseTokens(
      "operator 0123456789abcdef0123 owner=alice max_workers=8\n"
      "operator 0123456789abcdef0124 owner=alice\n"
      "admin    0123456789abcdef0125 max_workers=2 owner=bob\n"
      "operator 0123456789abcdef0126 owner=carol\n");
  ASSERT_THAT(file, IsOk());
  EXPECT_EQ(file->tokens[1].owner, "alice");
  EXPECT_EQ(file->tokens[2].owner, "bob");
  EXPECT_EQ(file->quotas, (OwnerQuotas{{"alice", 8}, {"bob", 2}}));
  // The same quota again is harmless; another is a contradiction.
  EXPECT_THAT(ParseTokens("operator 0123456789abcdef0123 owner=a max_workers=8\n"
                          "operator 0123456789abcdef0124 owner=a max_workers=8\n"),
              IsOk());
  EXPECT_THAT(ParseTokens("operator 0123456789abcdef0123 owner=a max_workers=8\n"
                          "operator 0123456789abcdef0124 owner=a max_workers=4\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("line 2"), HasSubstr("max_workers=8"))));
}

TEST(ParseTokens, OwnerLimitsAndScope_OnePerOwner) {
  auto file = ParseTokens(
      "worker   0123456789abcdef0120\n"
      "admin    0123456789abcdef0123 owner=alice max_queued=10\n"
      "operator 0123456789abcdef0124 owner=alice max_priority=3\n"
      "admin    0123456789abcdef0125 owner=ops scope=all\n");
  ASSERT_THAT(file, IsOk());
  EXPECT_FALSE(file->tokens[1].scope_all);
  EXPECT_TRUE(file->tokens[3].scope_all);
  // Every owner a non-worker line names, with what the file gives it.
  ASSERT_EQ(file->limits.size(), 2u);
  EXPECT_EQ(file->limits.at("alice").max_queued, 10u);
  EXPECT_EQ(file->limits.at("alice").max_priority, 3);
  EXPECT_FALSE(file->limits.at("ops").max_queued.has_value());
  EXPECT_THAT(ParseTokens("admin 0123456789abcdef0123 owner=a max_priority=1\n"
                          "admin 0123456789abcdef0124 owner=a max_priority=2\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("line 2"), HasSubstr("max_priority=1"))));
}

TEST(ParseTokens, BadOption_InvalidArgumentNamingLineAndForm) {
  for (const char* option : {"owner=", "max_workers=0", "max_workers=-1", "max_workers=x",
                             "quota=3", "extra", "max_queued=0", "max_priority=x", "scope=some"}) {
    SCOPED_TRACE(option);
    EXPECT_THAT(ParseTokens(absl::StrCat("worker 0123456789abcdef0123\n"
                                         "operator 0123456789abcdef0124 ",
                                         option, "\n")),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("line 2"), HasSubstr("owner=NAME"))));
  }
}

TEST(ParseTokens, UnknownRole_InvalidArgumentNamingLine) {
  EXPECT_THAT(ParseTokens("worker 0123456789abcdef0123\nroot 0123456789abcdef0124\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("line 2"), HasSubstr("unknown role \"root\""))));
}

TEST(ParseTokens, WrongFieldCount_InvalidArgument) {
  EXPECT_THAT(ParseTokens("worker\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 1")));
  EXPECT_THAT(ParseTokens("0123456789abcdef0123\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 field(s)")));
}

TEST(ParseTokens, ShortToken_RefusedWithoutQuotingIt) {
  auto parsed = ParseTokens("admin hunter2\n");
  EXPECT_THAT(parsed, StatusIs(absl::StatusCode::kInvalidArgument,
                               AllOf(HasSubstr("at least 16"), Not(HasSubstr("hunter2")))));
}

TEST(ParseTokens, SameTokenTwice_Refused) {
  EXPECT_THAT(
      ParseTokens("worker 0123456789abcdef0123\nadmin 0123456789abcdef0123\n"),
      StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr("line 2"), HasSubstr("twice"))));
}

TEST(ParseTokens, NoTokens_Refused) {
  EXPECT_THAT(ParseTokens("# nothing yet\n\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no \"<role> <token>\"")));
}

class TokenFileTest : public testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ddp-tokens-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    ::chmod(path.c_str(), 0600);
    return path;
  }
  std::string dir_;
};

TEST_F(TokenFileTest, LoadTokenFile_OneTokenWithComments_Trimmed) {
  const std::string path = Write("t", "# my worker token\n  0123456789abcdef0123  \n\n");
  EXPECT_THAT(LoadTokenFile("--token_file", path),
              testing::Eq(absl::StatusOr<std::string>("0123456789abcdef0123")));
}

TEST_F(TokenFileTest, LoadTokenFile_TwoTokensOrNone_Refused) {
  EXPECT_THAT(LoadTokenFile("--token_file", Write("two", "aaaaaaaaaaaaaaaa\nbbbbbbbbbbbbbbbb\n")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("more than one")));
  EXPECT_THAT(LoadTokenFile("--token_file", Write("none", "# empty\n")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("holds no token")));
}

TEST_F(TokenFileTest, Missing_ErrorNamesFlagAndPath) {
  const std::string path = dir_ + "/absent";
  EXPECT_THAT(LoadTokensFile("--tokens_file", path),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("--tokens_file=" + path), HasSubstr("No such file"))));
  EXPECT_THAT(LoadTokenFile("--token_file", dir_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a regular file")));
}

TEST_F(TokenFileTest, LoadTokensFile_BadLine_NamesFileAndLine) {
  const std::string path = Write("tokens", "worker 0123456789abcdef0123\nwizard x\n");
  EXPECT_THAT(LoadTokensFile("--tokens_file", path),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("--tokens_file=" + path + ": line 2"))));
}

TEST_F(TokenFileTest, LoadTokensFile_OthersOrOwnGroupMayRead_RefusedUnlessAllowed) {
  const std::string path = Write("tokens", "admin 0123456789abcdef0123\n");
  const std::vector<std::pair<mode_t, std::string>> readable = {{0644, "other users"},
                                                                {0604, "other users"},
                                                                {0602, "other users"},
                                                                {0640, "its group"},
                                                                {0620, "its group"}};
  for (const auto& [mode, who] : readable) {
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
    EXPECT_THAT(LoadTokensFile("--tokens_file", path),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("--tokens_file=" + path), HasSubstr(who + " may read"),
                               HasSubstr("chmod 600"), HasSubstr("--allow_readable_tokens"),
                               Not(HasSubstr("0123456789abcdef")))))
        << std::oct << mode;
    EXPECT_THAT(LoadTokensFile("--tokens_file", path, /*allow_readable=*/true), IsOk());
  }
  for (mode_t mode : {0600, 0400}) {
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
    EXPECT_THAT(LoadTokensFile("--tokens_file", path), IsOk()) << std::oct << mode;
  }
}

TEST_F(TokenFileTest, LoadTokensFile_AnotherOwnersFileOurGroupMayRead_Accepted) {
  // root:ddp 0640, as the systemd units install it: only root can make one.
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give the file another owner";
  const std::string path = Write("tokens", "admin 0123456789abcdef0123\n");
  ASSERT_EQ(::chown(path.c_str(), 65534, ::getegid()), 0);
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  EXPECT_THAT(LoadTokensFile("--tokens_file", path), IsOk());
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  EXPECT_THAT(LoadTokensFile("--tokens_file", path),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("other users may read")));
}

TEST_F(TokenFileTest, LoadTokenFile_ReadableByOthers_OnlyWarned) {
  const std::string path = Write("worker.token", "0123456789abcdef0123\n");
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  EXPECT_THAT(LoadTokenFile("--token_file", path), IsOk());
}

TEST(RandomToken, HexOfRequestedLength_AndDifferentEachTime) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string t = RandomToken();
    EXPECT_EQ(t.size(), 32u);
    EXPECT_EQ(t.find_first_not_of("0123456789abcdef"), std::string::npos) << t;
    seen.insert(t);
  }
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_EQ(RandomToken(4).size(), 8u);
}

TEST(ConstantTimeEquals, EqualAndUnequal) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));  // a prefix is not a match
  EXPECT_FALSE(ConstantTimeEquals("abc", ""));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0b", 3), "a"));
}

}  // namespace
}  // namespace ddp
