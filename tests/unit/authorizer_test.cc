// Who may call what: the method -> role table, bearer-token checks, and
// that every RPC of ddp.v1.Coordinator has an entry (a new one must not be
// open by accident).
#include "coordinator/authorizer.h"

#include "ddp/v1/coordinator.pb.h"
#include "google/protobuf/descriptor.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

constexpr char kWorkerToken[] = "worker-token-0123456789";
constexpr char kOperatorToken[] = "operator-token-0123456789";
constexpr char kAdminToken[] = "admin-token-0123456789";

Authorizer ThreeRoles() {
  return Authorizer({{Role::kWorker, kWorkerToken},
                     {Role::kOperator, kOperatorToken},
                     {Role::kAdmin, kAdminToken}});
}

std::string Bearer(const std::string& token) { return "Bearer " + token; }

TEST(RolesFor, Table_EachMethodItsRoles) {
  EXPECT_THAT(RolesFor(method::kAttach), ElementsAre(Role::kWorker));
  EXPECT_THAT(RolesFor(method::kStoreSet), ElementsAre(Role::kWorker));
  EXPECT_THAT(RolesFor(method::kStoreGet), ElementsAre(Role::kWorker));
  EXPECT_THAT(RolesFor(method::kStoreAdd), ElementsAre(Role::kWorker));
  for (const char* m : {method::kGetStatus, method::kListWorkers, method::kWatchStatus,
                        method::kListJobs, method::kGetJob}) {
    EXPECT_THAT(RolesFor(m), UnorderedElementsAre(Role::kOperator, Role::kAdmin)) << m;
  }
  EXPECT_THAT(RolesFor(method::kSubmitJob), ElementsAre(Role::kAdmin));
  EXPECT_THAT(RolesFor(method::kCancelJob), ElementsAre(Role::kAdmin));
  EXPECT_TRUE(RolesFor("/ddp.v1.Coordinator/NotAMethod").empty());
}

TEST(RolesFor, EveryCoordinatorMethod_HasAnEntry) {
  // The generated descriptor lists every RPC the proto declares.
  const google::protobuf::ServiceDescriptor* service =
      v1::GetStatusRequest::descriptor()->file()->FindServiceByName("Coordinator");
  ASSERT_NE(service, nullptr);
  ASSERT_GE(service->method_count(), 9);
  for (int i = 0; i < service->method_count(); ++i) {
    const std::string name = "/" + service->full_name() + "/" + service->method(i)->name();
    EXPECT_FALSE(RolesFor(name).empty()) << name << " has no role in the authorizer's table";
  }
}

TEST(Authorizer, Open_AllowsEverythingWithoutToken) {
  Authorizer open;
  EXPECT_FALSE(open.enabled());
  EXPECT_THAT(open.Check(method::kCancelJob, std::nullopt), IsOk());
  EXPECT_THAT(open.Check("/anything/Else", std::string("junk")), IsOk());
}

TEST(Authorizer, MissingToken_UnauthenticatedNamingTheRoleNeeded) {
  EXPECT_THAT(
      ThreeRoles().Check(method::kGetStatus, std::nullopt),
      StatusIs(absl::StatusCode::kUnauthenticated,
               AllOf(HasSubstr("ddp.v1.Coordinator/GetStatus"),
                     HasSubstr("an operator or admin token"), HasSubstr("authorization: Bearer"))));
}

TEST(Authorizer, NotBearer_Unauthenticated) {
  const Authorizer a = ThreeRoles();
  EXPECT_THAT(a.Check(method::kGetStatus, std::string(kOperatorToken)),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("Bearer <token>")));
  EXPECT_THAT(a.Check(method::kGetStatus, std::string("Basic abc")),
              StatusIs(absl::StatusCode::kUnauthenticated));
  // The scheme is case-insensitive (RFC 6750 / 7235).
  EXPECT_THAT(a.Check(method::kGetStatus, "bearer " + std::string(kOperatorToken)), IsOk());
}

TEST(Authorizer, UnknownToken_UnauthenticatedWithoutQuotingIt) {
  const Authorizer a = ThreeRoles();
  for (const std::string& token : {std::string("nope"), std::string(kAdminToken) + "x",
                                   std::string(kAdminToken).substr(1), std::string("")}) {
    absl::Status s = a.Check(method::kGetStatus, Bearer(token));
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("unknown bearer token")))
        << token;
    if (!token.empty()) {
      EXPECT_THAT(std::string(s.message()), Not(HasSubstr(token)));
    }
  }
}

TEST(Authorizer, KnownTokenWrongRole_PermissionDeniedNamingBothRoles) {
  const Authorizer a = ThreeRoles();
  EXPECT_THAT(a.Check(method::kCancelJob, Bearer(kOperatorToken)),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("CancelJob needs an admin token"),
                             HasSubstr("this token's role is operator"))));
  EXPECT_THAT(a.Check(method::kAttach, Bearer(kAdminToken)),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("needs a worker token")));
  EXPECT_THAT(
      a.Check(method::kGetStatus, Bearer(kWorkerToken)),
      StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("needs an operator or admin token")));
  EXPECT_THAT(a.Check(method::kStoreGet, Bearer(kOperatorToken)),
              StatusIs(absl::StatusCode::kPermissionDenied));
}

TEST(Authorizer, EachRole_AllowedItsMethods) {
  const Authorizer a = ThreeRoles();
  for (const char* m : {method::kAttach, method::kStoreSet, method::kStoreGet, method::kStoreAdd}) {
    EXPECT_THAT(a.Check(m, Bearer(kWorkerToken)), IsOk()) << m;
  }
  for (const char* m : {method::kGetStatus, method::kListWorkers, method::kWatchStatus,
                        method::kListJobs, method::kGetJob}) {
    EXPECT_THAT(a.Check(m, Bearer(kOperatorToken)), IsOk()) << m;
    EXPECT_THAT(a.Check(m, Bearer(kAdminToken)), IsOk()) << m;
  }
  for (const char* m : {method::kSubmitJob, method::kCancelJob}) {
    EXPECT_THAT(a.Check(m, Bearer(kAdminToken)), IsOk()) << m;
  }
}

TEST(Authorizer, UnknownMethod_RefusedEvenForAdmin) {
  EXPECT_THAT(ThreeRoles().Check("/ddp.v1.Coordinator/Future", Bearer(kAdminToken)),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("not in the authorizer")));
}

}  // namespace
}  // namespace ddp
