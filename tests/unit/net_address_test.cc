#include "common/net_address.h"

#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

TEST(ParseHostPort, GoodAddresses_Parsed) {
  struct Case {
    const char* in;
    const char* host;
    int port;
  };
  for (const Case& c :
       {Case{"127.0.0.1:29400", "127.0.0.1", 29400},
        Case{"coordinator.example:1", "coordinator.example", 1}, Case{"[::1]:65535", "::1", 65535},
        Case{"[fd00::7]:80", "fd00::7", 80}, Case{"dns:///host-a_b:29400", "host-a_b", 29400},
        Case{"ipv4:10.0.0.1:5", "10.0.0.1", 5}}) {
    auto parsed = ParseHostPort(c.in);
    ASSERT_THAT(parsed, IsOk()) << c.in;
    EXPECT_EQ(parsed->host, c.host) << c.in;
    EXPECT_EQ(parsed->port, c.port) << c.in;
  }
}

TEST(ParseHostPort, BadAddresses_InvalidArgumentSayingWhy) {
  struct Case {
    const char* in;
    const char* why;
  };
  for (const Case& c :
       {Case{"", "no port"}, Case{"localhost", "no port"}, Case{"host:", "the port must be"},
        Case{"host:0", "from 1 to 65535"}, Case{"host:65536", "from 1 to 65535"},
        Case{"host:+1", "the port"}, Case{"host:29400x", "the port"},
        Case{":29400", "the host must be"}, Case{"http://host:29400", "no URL scheme"},
        Case{"::1:29400", "in brackets"}, Case{"[::1:29400", "not HOST:PORT"},
        Case{"[nothex]:1", "not an IPv6"}, Case{"ho st:1", "the host must be"}}) {
    EXPECT_THAT(ParseHostPort(c.in), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.why)))
        << c.in;
  }
}

TEST(ParseHostPort, PortZero_OnlyWhenAllowed) {
  EXPECT_THAT(ParseHostPort("0.0.0.0:0"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseHostPort("0.0.0.0:0", /*allow_port_zero=*/true), IsOk());
}

TEST(ParseHostPort, LongInput_EchoedShort) {
  const std::string junk(10000, 'x');
  auto parsed = ParseHostPort(junk);
  ASSERT_FALSE(parsed.ok());
  EXPECT_LT(parsed.status().message().size(), 400u);
}

TEST(IsLocalAddress, LoopbackOnly) {
  for (const char* local : {"127.0.0.1:0", "127.1.2.3:80", "localhost:29400", "[::1]:1",
                            "[::ffff:127.0.0.1]:1", "unix:/tmp/ddp.sock"}) {
    EXPECT_TRUE(IsLocalAddress(local)) << local;
  }
  for (const char* remote : {"0.0.0.0:0", "[::]:29400", "10.0.0.1:29400", "coordinator:1",
                             "128.0.0.1:1", "[fd00::1]:1", "garbage"}) {
    EXPECT_FALSE(IsLocalAddress(remote)) << remote;
  }
}

}  // namespace
}  // namespace ddp
