#include "coordinator/authorizer.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/credentials.h"

namespace ddp {
namespace {

struct MethodRoles {
  const char* method;
  std::vector<Role> roles;
};

const std::vector<MethodRoles>& Table() {
  static const auto* table = new std::vector<MethodRoles>{
      {method::kAttach, {Role::kWorker}},
      {method::kStoreSet, {Role::kWorker}},
      {method::kStoreGet, {Role::kWorker}},
      {method::kStoreAdd, {Role::kWorker}},
      {method::kGetStatus, {Role::kOperator, Role::kAdmin}},
      {method::kListWorkers, {Role::kOperator, Role::kAdmin}},
      {method::kWatchStatus, {Role::kOperator, Role::kAdmin}},
      {method::kListJobs, {Role::kOperator, Role::kAdmin}},
      {method::kGetJob, {Role::kOperator, Role::kAdmin}},
      {method::kSubmitJob, {Role::kAdmin}},
      {method::kCancelJob, {Role::kAdmin}},
  };
  return *table;
}

// "an operator or admin token"
std::string Needs(const std::vector<Role>& roles) {
  if (roles.empty()) return "a role no token has (the method is not in the authorizer's table)";
  std::vector<std::string> names;
  for (Role r : roles) names.emplace_back(RoleName(r));
  const bool vowel = names[0][0] == 'a' || names[0][0] == 'o';
  return absl::StrCat(vowel ? "an " : "a ", absl::StrJoin(names, " or "), " token");
}

}  // namespace

std::vector<Role> RolesFor(absl::string_view method) {
  for (const MethodRoles& m : Table()) {
    if (method == m.method) return m.roles;
  }
  return {};
}

Authorizer::Authorizer(std::vector<TokenEntry> tokens)
    : enabled_(true), tokens_(std::move(tokens)) {}

absl::Status Authorizer::Check(absl::string_view method,
                               std::optional<absl::string_view> authorization) const {
  if (!enabled_) return absl::OkStatus();
  const absl::string_view name = absl::StripPrefix(method, "/");
  const std::vector<Role> allowed = RolesFor(method);
  if (!authorization) {
    return absl::UnauthenticatedError(
        absl::StrCat(name, " needs ", Needs(allowed),
                     " in the call's metadata (authorization: Bearer <token>); none was sent"));
  }
  absl::string_view token = *authorization;
  if (token.size() < 7 || !absl::EqualsIgnoreCase(token.substr(0, 7), "Bearer ")) {
    return absl::UnauthenticatedError(
        "the authorization metadata must be \"Bearer <token>\" (RFC 6750)");
  }
  token = token.substr(7);
  const std::optional<Role> role = FindTokenRole(tokens_, token);
  if (!role) {
    return absl::UnauthenticatedError(
        "unknown bearer token: it is not in the coordinator's --tokens_file");
  }
  if (std::find(allowed.begin(), allowed.end(), *role) == allowed.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat(name, " needs ", Needs(allowed), "; this token's role is ", RoleName(*role)));
  }
  return absl::OkStatus();
}

absl::Status Authorizer::Check(absl::string_view method,
                               const grpc::ServerContextBase& context) const {
  if (!enabled_) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthorizationMetadata);
  if (it == metadata.end()) return Check(method, std::nullopt);
  return Check(method, absl::string_view(it->second.data(), it->second.size()));
}

const TokenEntry* Authorizer::EntryOf(const grpc::ServerContextBase& context) const {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthorizationMetadata);
  if (it == metadata.end() || it->second.size() < 7) return nullptr;
  return FindToken(tokens_, absl::string_view(it->second.data() + 7, it->second.size() - 7));
}

std::string Authorizer::OwnerOf(const grpc::ServerContextBase& context) const {
  if (!enabled_) return "";
  const TokenEntry* entry = EntryOf(context);
  return entry ? entry->owner : "";
}

bool Authorizer::ActsForAll(const grpc::ServerContextBase& context) const {
  if (!enabled_) return true;
  const TokenEntry* entry = EntryOf(context);
  return entry != nullptr && entry->scope_all;
}

}  // namespace ddp
