#include "common/store_client.h"

#include "absl/strings/str_cat.h"
#include "common/credentials.h"
#include "common/grpc_status.h"

namespace ddp {
namespace {

// Unary store calls other than a waiting get should answer at once.
constexpr absl::Duration kCallTimeout = absl::Seconds(30);

absl::Status WithContext(const grpc::Status& s, const std::string& what) {
  absl::Status status = FromGrpcStatus(s);
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

}  // namespace

void StoreClient::Prepare(grpc::ClientContext* context, absl::Duration timeout) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!store_token_.empty()) context->AddMetadata(kStoreTokenMetadata, store_token_);
}

absl::Status StoreClient::Set(const std::string& key, const std::string& value) {
  grpc::ClientContext context;
  Prepare(&context, kCallTimeout);
  v1::StoreSetRequest request;
  request.set_job_id(job_id_);
  request.set_generation(generation_);
  request.set_key(key);
  request.set_value(value);
  v1::StoreSetResponse response;
  return WithContext(stub_->StoreSet(&context, request, &response),
                     absl::StrCat("store set ", key));
}

absl::StatusOr<std::string> StoreClient::Get(const std::string& key, absl::Duration timeout) {
  grpc::ClientContext context;
  // The server answers DEADLINE_EXCEEDED itself at `timeout`; the margin
  // keeps the client deadline from racing it.
  Prepare(&context, timeout + absl::Seconds(5));
  v1::StoreGetRequest request;
  request.set_job_id(job_id_);
  request.set_generation(generation_);
  request.set_key(key);
  request.set_timeout_seconds(absl::ToDoubleSeconds(timeout));
  v1::StoreGetResponse response;
  absl::Status s =
      WithContext(stub_->StoreGet(&context, request, &response), absl::StrCat("store get ", key));
  if (!s.ok()) return s;
  return std::move(*response.mutable_value());
}

absl::StatusOr<int64_t> StoreClient::Add(const std::string& key, int64_t delta) {
  grpc::ClientContext context;
  Prepare(&context, kCallTimeout);
  v1::StoreAddRequest request;
  request.set_job_id(job_id_);
  request.set_generation(generation_);
  request.set_key(key);
  request.set_delta(delta);
  v1::StoreAddResponse response;
  absl::Status s =
      WithContext(stub_->StoreAdd(&context, request, &response), absl::StrCat("store add ", key));
  if (!s.ok()) return s;
  return response.value();
}

}  // namespace ddp
