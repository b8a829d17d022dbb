#include "coordinator/etcd_state_store.h"

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ddp {
namespace {

std::string FormatKey(const std::string& prefix) { return prefix + "/format"; }
std::string StateKey(const std::string& prefix) { return prefix + "/state"; }
std::string WriterKey(const std::string& prefix) { return prefix + "/writer"; }

absl::Status ForeignFormat(const std::string& prefix, const std::string& found) {
  return absl::FailedPreconditionError(absl::StrCat(
      "etcd prefix ", prefix, " holds state of format \"", absl::CEscape(found),
      "\"; this coordinator reads and writes \"", kEtcdStateFormat,
      "\" (a newer coordinator's state? use the matching version, or another --etcd_prefix)"));
}

}  // namespace

absl::Status EtcdStateStore::ClaimPrefix(EtcdClient* etcd, const std::string& prefix) {
  absl::StatusOr<EtcdRangeResult> format = etcd->Range(FormatKey(prefix));
  if (!format.ok()) return format.status();
  if (!format->kvs.empty()) {
    if (format->kvs.front().value == kEtcdStateFormat) return absl::OkStatus();
    return ForeignFormat(prefix, format->kvs.front().value);
  }
  const std::string under = prefix + "/";
  absl::StatusOr<EtcdRangeResult> keys = etcd->Range(under, RangeEndForPrefix(under), 1);
  if (!keys.ok()) return keys.status();
  // Candidates may enter before the first coordinator marks the prefix.
  const std::string candidates = prefix + "/leader/";
  if (!keys->kvs.empty() && keys->kvs.front().key.rfind(candidates, 0) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "etcd prefix ", prefix, " holds ", keys->count,
        " keys that are not a ddp coordinator's (the first: ", absl::CEscape(keys->kvs.front().key),
        "); use another --etcd_prefix"));
  }
  absl::StatusOr<EtcdTxnResult> txn =
      etcd->Txn({CreateRevisionIs(FormatKey(prefix), 0)},
                {PutOp(FormatKey(prefix), kEtcdStateFormat)}, {ReadOp(FormatKey(prefix))});
  if (!txn.ok()) return txn.status();
  // Another coordinator marked it first: it must have marked it the same.
  if (!txn->succeeded && !txn->ranges.empty() && !txn->ranges.front().empty() &&
      txn->ranges.front().front().value != kEtcdStateFormat) {
    return ForeignFormat(prefix, txn->ranges.front().front().value);
  }
  return absl::OkStatus();
}

EtcdStateStore::EtcdStateStore(EtcdClient* etcd, std::string prefix, const LeaderElection* election,
                               StateSeal seal)
    : etcd_(etcd), prefix_(std::move(prefix)), election_(election), seal_(std::move(seal)) {}

absl::StatusOr<std::optional<v1::DurableState>> EtcdStateStore::Load() const {
  absl::StatusOr<EtcdRangeResult> read = etcd_->Range(StateKey(prefix_));
  if (!read.ok()) return read.status();
  if (read->kvs.empty()) return std::optional<v1::DurableState>();
  const std::string where = absl::StrCat("etcd key ", StateKey(prefix_));
  absl::StatusOr<std::string> payload = seal_.Open(read->kvs.front().value, where);
  if (!payload.ok()) return payload.status();
  v1::DurableState state;
  if (!state.ParseFromString(*payload)) {
    return absl::DataLossError(absl::StrCat("etcd key ", StateKey(prefix_),
                                            " does not parse as a coordinator's state; delete it "
                                            "(etcdctl del) to start fresh"));
  }
  return std::optional<v1::DurableState>(std::move(state));
}

absl::Status EtcdStateStore::Save(const v1::DurableState& state, uint64_t sequence) {
  absl::MutexLock lock(&mu_);
  if (sequence < saved_sequence_) return absl::OkStatus();
  const int64_t lease = election_->lease();
  std::vector<EtcdOp> writes = {
      PutOp(StateKey(prefix_), seal_.Seal(state.SerializeAsString())),
      PutOp(WriterKey(prefix_), absl::StrFormat("%016x", static_cast<uint64_t>(lease)))};
  absl::StatusOr<EtcdTxnResult> txn = etcd_->Txn(election_->Guard(), writes);
  if (!txn.ok()) return txn.status();
  if (!txn->succeeded) {
    return absl::FailedPreconditionError(
        "etcd refused the state write: this coordinator's leader key is gone (its lease "
        "expired), so it no longer leads");
  }
  saved_sequence_ = sequence;
  return absl::OkStatus();
}

std::string EtcdStateStore::Describe() const {
  return absl::StrCat("etcd key ", StateKey(prefix_), " (at ", etcd_->endpoint(), ")");
}

}  // namespace ddp
