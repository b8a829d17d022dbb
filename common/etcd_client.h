// A small etcd v3 client on gRPC: the KV, Lease and Watch calls the
// coordinator's replicated state and leader election need, with the
// project's Status conventions. The messages are declared in
// proto/etcd/etcd.proto (and kv.proto) with etcd's own packages and field
// numbers.
//
// Several endpoints (members of one cluster): a call goes to the member that
// last answered and moves on to the next on UNAVAILABLE or a deadline, so one
// member lost is not seen by callers. Every call has a deadline
// (Options::timeout) per member tried.
//
// Errors: a member's answer keeps etcd's code (NOT_FOUND for an unknown
// lease, INVALID_ARGUMENT, ...) with "etcd HOST:PORT: Op: " before its
// message; no member answering is UNAVAILABLE "etcd unreachable at A, B:
// ...". A write that timed out on one member may still have been applied
// when it is retried on the next: a Txn guarded by its own effect (a
// create_revision of 0) can then report succeeded = false.
//
// Thread-safe.
#ifndef DDP_COMMON_ETCD_CLIENT_H_
#define DDP_COMMON_ETCD_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ddp {

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct EtcdRangeResult {
  std::vector<EtcdKeyValue> kvs;
  int64_t revision = 0;  // the store's revision when read
  int64_t count = 0;     // keys in the range (kvs may be limited)
};

// One comparison of a transaction, on one key (etcd's Compare).
struct EtcdCompare {
  enum class Target { kVersion, kCreateRevision, kModRevision, kValue, kLease };
  enum class Result { kEqual, kGreater, kLess, kNotEqual };
  std::string key;
  Target target = Target::kVersion;
  Result result = Result::kEqual;
  int64_t number = 0;  // version, a revision, or a lease id
  std::string value;   // for kValue
};

// One operation of a transaction's branch.
struct EtcdOp {
  enum class Kind { kPut, kDelete, kRange };
  Kind kind = Kind::kPut;
  std::string key;
  std::string value;      // kPut
  int64_t lease = 0;      // kPut
  std::string range_end;  // kDelete, kRange: "" for the one key
};

// The comparisons and operations the coordinator's transactions use.
inline EtcdCompare CreateRevisionIs(std::string key, int64_t revision) {
  EtcdCompare c;
  c.key = std::move(key);
  c.target = EtcdCompare::Target::kCreateRevision;
  c.number = revision;  // 0: the key does not exist
  return c;
}
inline EtcdOp PutOp(std::string key, std::string value, int64_t lease = 0) {
  EtcdOp op;
  op.key = std::move(key);
  op.value = std::move(value);
  op.lease = lease;
  return op;
}
inline EtcdOp ReadOp(std::string key) {
  EtcdOp op;
  op.kind = EtcdOp::Kind::kRange;
  op.key = std::move(key);
  return op;
}

struct EtcdTxnResult {
  bool succeeded = false;  // the compares held: the success branch ran
  int64_t revision = 0;    // the store's revision after the transaction
  // Per operation of the branch that ran: the keys a kRange read.
  std::vector<std::vector<EtcdKeyValue>> ranges;
};

struct EtcdEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  EtcdKeyValue kv;  // for kDelete: key and mod_revision only
};

// A watch in progress; destroying it cancels the watch and waits for its
// thread.
class EtcdWatch {
 public:
  virtual ~EtcdWatch() = default;
};

class EtcdClient {
 public:
  struct Options {
    std::vector<std::string> endpoints;  // HOST:PORT of each member
    // TLS to etcd: all empty means plaintext. ca alone: server TLS;
    // cert and key too: mutual TLS.
    std::string ca_file, cert_file, key_file;
    // etcd's user authentication: a user and its password (empty user: none;
    // with client certificates, etcd takes the user from the certificate).
    std::string user, password;
    absl::Duration timeout = absl::Seconds(1);  // each unary call's deadline
    // Told of every unary call once it is done (its name, e.g. "Txn", how
    // long it took over every member tried, whether it succeeded): for
    // metrics. Called on the caller's thread; must be quick.
    std::function<void(const char* op, absl::Duration took, bool ok)> on_call;
  };
  // Makes the channels (no call yet). INVALID_ARGUMENT for no endpoints or an
  // unreadable TLS file.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(Options options);
  virtual ~EtcdClient() = default;

  // `range_end` "" reads the one key; RangeEndForPrefix(p) reads a prefix.
  // `limit` 0: all keys. Sorted by key.
  virtual absl::StatusOr<EtcdRangeResult> Range(const std::string& key,
                                                const std::string& range_end = "",
                                                int64_t limit = 0) = 0;
  // Returns the revision of the put.
  virtual absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value,
                                      int64_t lease = 0) = 0;
  // Returns how many keys were deleted.
  virtual absl::StatusOr<int64_t> Delete(const std::string& key,
                                         const std::string& range_end = "") = 0;
  virtual absl::StatusOr<EtcdTxnResult> Txn(const std::vector<EtcdCompare>& compares,
                                            const std::vector<EtcdOp>& success,
                                            const std::vector<EtcdOp>& failure = {}) = 0;

  // A lease of `ttl`, rounded up to whole seconds (etcd's unit); returns its
  // id.
  virtual absl::StatusOr<int64_t> LeaseGrant(absl::Duration ttl) = 0;
  // Renews the lease once and returns the TTL the server granted from now.
  // NOT_FOUND when the lease has expired or was revoked.
  virtual absl::StatusOr<absl::Duration> LeaseKeepAlive(int64_t lease) = 0;
  virtual absl::Status LeaseRevoke(int64_t lease) = 0;

  // Calls `on_events` (on a thread of the watch's) with each batch of
  // changes to the keys in [key, range_end) from `start_revision` on, that
  // revision included (etcd's rule; 0: from now). `on_error` is called once
  // if the watch ends other than by being destroyed, and no call follows:
  // UNAVAILABLE (the member was lost; the next Watch goes to another),
  // OUT_OF_RANGE (`start_revision` was compacted), ABORTED (the server
  // canceled it). The watch stays on the member it started on; callers
  // watch again, from the revision after the last event seen. Don't destroy
  // the watch from its own callbacks.
  virtual std::unique_ptr<EtcdWatch> Watch(
      const std::string& key, const std::string& range_end, int64_t start_revision,
      std::function<void(const std::vector<EtcdEvent>&)> on_events,
      std::function<void(const absl::Status&)> on_error) = 0;

  // The endpoint the last call went to, for messages.
  virtual std::string endpoint() const = 0;
};

// The range_end that makes a Range, Delete or Watch cover every key starting
// with `prefix` (etcd's convention: the prefix with its last byte + 1).
std::string RangeEndForPrefix(const std::string& prefix);

}  // namespace ddp

#endif  // DDP_COMMON_ETCD_CLIENT_H_
