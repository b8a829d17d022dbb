#include "common/etcd_client.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/etcd_auth.h"
#include "etcd/etcd.grpc.pb.h"
#include "grpcpp/alarm.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/credentials.h"

namespace ddp {
namespace {

namespace pb = etcdserverpb;

// Certificates and keys are a few kilobytes; a chain file a few dozen.
constexpr size_t kMaxPemBytes = 1 << 20;
// A prefix read can exceed gRPC's 4 MiB default; etcd itself caps a
// request at 1.5 MiB but not a response.
constexpr int kMaxResponseBytes = 64 << 20;

absl::StatusOr<std::string> ReadPem(const char* what, const std::string& path) {
  const std::string where = absl::StrCat("etcd TLS ", what, " file ", path, ": ");
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(where + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(where + "not a file");
  if (static_cast<size_t>(st.st_size) > kMaxPemBytes) {
    return absl::InvalidArgumentError(where + "larger than 1 MiB; not a PEM file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(where + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().empty()) return absl::InvalidArgumentError(where + "empty");
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeCredentials(
    const EtcdClient::Options& options) {
  if (options.ca_file.empty() && options.cert_file.empty() && options.key_file.empty()) {
    return grpc::InsecureChannelCredentials();
  }
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError(
        "etcd TLS: a client certificate needs its key, and a key "
        "its certificate");
  }
  grpc::SslCredentialsOptions ssl;
  if (!options.ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadPem("CA", options.ca_file);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
  }
  if (!options.cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadPem("certificate", options.cert_file);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem("key", options.key_file);
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(ssl);
}

grpc::ChannelArguments ChannelArgs() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxResponseBytes);
  // A watch stream to a member that hangs (SIGSTOP, a partition) would
  // otherwise wait forever. etcd refuses pings more often than every 5 s
  // (--grpc-keepalive-min-time) and any ping without a call in flight.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // A member that comes back is used again within a second, not after
  // gRPC's backoff has grown to two minutes.
  // (Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC takes that as the connect
  // timeout too, and a short one fails connections to a busy member.)
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return args;
}

// Codes that say "this member did not answer": try another.
bool MovesOn(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

absl::Status Failure(const std::string& endpoint, const char* op, const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat("etcd ", endpoint, ": ", op, ": ", s.error_message()));
}

// etcd rejects an empty key; a range from the very first key starts at
// "\0" instead (what RangeEndForPrefix("") pairs with).
std::string RangeStart(const std::string& key, const std::string& range_end) {
  return key.empty() && !range_end.empty() ? std::string(1, '\0') : key;
}

EtcdKeyValue FromProto(const mvccpb::KeyValue& kv) {
  EtcdKeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.version = kv.version();
  out.lease = kv.lease();
  return out;
}

std::vector<EtcdKeyValue> FromProto(
    const google::protobuf::RepeatedPtrField<mvccpb::KeyValue>& kvs) {
  std::vector<EtcdKeyValue> out;
  out.reserve(kvs.size());
  for (const mvccpb::KeyValue& kv : kvs) out.push_back(FromProto(kv));
  return out;
}

pb::Compare ToProto(const EtcdCompare& c) {
  pb::Compare out;
  out.set_key(c.key);
  switch (c.result) {
    case EtcdCompare::Result::kEqual:
      out.set_result(pb::Compare::EQUAL);
      break;
    case EtcdCompare::Result::kGreater:
      out.set_result(pb::Compare::GREATER);
      break;
    case EtcdCompare::Result::kLess:
      out.set_result(pb::Compare::LESS);
      break;
    case EtcdCompare::Result::kNotEqual:
      out.set_result(pb::Compare::NOT_EQUAL);
      break;
  }
  switch (c.target) {
    case EtcdCompare::Target::kVersion:
      out.set_target(pb::Compare::VERSION);
      out.set_version(c.number);
      break;
    case EtcdCompare::Target::kCreateRevision:
      out.set_target(pb::Compare::CREATE);
      out.set_create_revision(c.number);
      break;
    case EtcdCompare::Target::kModRevision:
      out.set_target(pb::Compare::MOD);
      out.set_mod_revision(c.number);
      break;
    case EtcdCompare::Target::kValue:
      out.set_target(pb::Compare::VALUE);
      out.set_value(c.value);
      break;
    case EtcdCompare::Target::kLease:
      out.set_target(pb::Compare::LEASE);
      out.set_lease(c.number);
      break;
  }
  return out;
}

pb::RequestOp ToProto(const EtcdOp& op) {
  pb::RequestOp out;
  switch (op.kind) {
    case EtcdOp::Kind::kPut: {
      pb::PutRequest* put = out.mutable_request_put();
      put->set_key(op.key);
      put->set_value(op.value);
      put->set_lease(op.lease);
      break;
    }
    case EtcdOp::Kind::kDelete: {
      pb::DeleteRangeRequest* del = out.mutable_request_delete_range();
      del->set_key(RangeStart(op.key, op.range_end));
      del->set_range_end(op.range_end);
      break;
    }
    case EtcdOp::Kind::kRange: {
      pb::RangeRequest* range = out.mutable_request_range();
      range->set_key(RangeStart(op.key, op.range_end));
      range->set_range_end(op.range_end);
      break;
    }
  }
  return out;
}

struct Endpoint {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
};

// Which endpoint calls go to first: the one that last answered. Shared with
// the watches, which may outlive the client.
class Rotation {
 public:
  explicit Rotation(size_t size) : size_(size) {}
  size_t current() const {
    absl::MutexLock lock(&mu_);
    return current_;
  }
  void Answered(size_t i) {
    absl::MutexLock lock(&mu_);
    current_ = i;
  }
  // Endpoint `i` did not answer: the next call starts after it, unless
  // another call has moved on already.
  void Failed(size_t i) {
    absl::MutexLock lock(&mu_);
    if (current_ == i) current_ = (i + 1) % size_;
  }

 private:
  const size_t size_;
  mutable absl::Mutex mu_;
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
};

class GrpcEtcdWatch final : public EtcdWatch {
 public:
  GrpcEtcdWatch(std::string endpoint, size_t index, std::shared_ptr<grpc::Channel> channel,
                std::shared_ptr<Rotation> rotation, pb::WatchCreateRequest request,
                std::function<void(const std::vector<EtcdEvent>&)> on_events,
                std::function<void(const absl::Status&)> on_error, const std::string& token)
      : endpoint_(std::move(endpoint)),
        index_(index),
        stub_(pb::Watch::NewStub(std::move(channel))),
        rotation_(std::move(rotation)),
        request_(std::move(request)),
        on_events_(std::move(on_events)),
        on_error_(std::move(on_error)) {
    if (!token.empty()) context_.AddMetadata("token", token);
    thread_ = std::thread([this] { Run(); });
  }

  ~GrpcEtcdWatch() override {
    {
      absl::MutexLock lock(&mu_);
      destroyed_ = true;
    }
    // Safe before the call has started too: gRPC cancels it as it starts.
    context_.TryCancel();
    thread_.join();
  }

 private:
  bool destroyed() const {
    absl::MutexLock lock(&mu_);
    return destroyed_;
  }

  void Run() {
    std::unique_ptr<grpc::ClientReaderWriter<pb::WatchRequest, pb::WatchResponse>> stream =
        stub_->Watch(&context_);
    pb::WatchRequest create;
    *create.mutable_create_request() = request_;
    absl::Status ended;  // set when the server ended the watch, not the stream
    if (stream->Write(create)) {
      pb::WatchResponse response;
      while (stream->Read(&response)) {
        if (response.compact_revision() != 0) {
          ended = absl::OutOfRangeError(
              absl::StrCat("etcd ", endpoint_, ": Watch: revision ", request_.start_revision(),
                           " was compacted; the oldest left is ", response.compact_revision()));
          break;
        }
        if (response.canceled()) {
          ended = absl::AbortedError(absl::StrCat(
              "etcd ", endpoint_, ": Watch: canceled by the server: ", response.cancel_reason()));
          break;
        }
        if (response.events().empty()) continue;  // `created`, or progress
        std::vector<EtcdEvent> events;
        events.reserve(response.events_size());
        for (const mvccpb::Event& e : response.events()) {
          EtcdEvent event;
          event.type =
              e.type() == mvccpb::Event::DELETE ? EtcdEvent::Type::kDelete : EtcdEvent::Type::kPut;
          event.kv = FromProto(e.kv());
          events.push_back(std::move(event));
        }
        if (destroyed()) break;
        on_events_(events);
      }
    }
    // The server keeps the stream open after ending a watch on it.
    if (!ended.ok()) context_.TryCancel();
    const grpc::Status finished = stream->Finish();
    if (destroyed()) return;
    if (ended.ok()) {
      if (MovesOn(finished.error_code())) rotation_->Failed(index_);
      ended = finished.ok() ? absl::UnavailableError(
                                  absl::StrCat("etcd ", endpoint_, ": Watch: the stream ended"))
                            : Failure(endpoint_, "Watch", finished);
    }
    on_error_(ended);
  }

  const std::string endpoint_;
  const size_t index_;
  const std::unique_ptr<pb::Watch::Stub> stub_;
  const std::shared_ptr<Rotation> rotation_;
  const pb::WatchCreateRequest request_;
  const std::function<void(const std::vector<EtcdEvent>&)> on_events_;
  const std::function<void(const absl::Status&)> on_error_;
  grpc::ClientContext context_;
  mutable absl::Mutex mu_;
  bool destroyed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// gRPC (1.51, synchronous API) moves a connection attempt on only while a
// thread polls: a call in flight, or its backup poller every 5 s. A call to
// a member whose channel is failing fails at once and polls nothing, so a
// member that came back would be used 5-10 s late (seen with a restarted
// etcd). This thread polls for the process (Linux's epoll1 engine polls
// every connection from any thread), until destroyed.
class Poller {
 public:
  Poller() : thread_([this] { Run(); }) {}
  ~Poller() {
    wake_.Set(&cq_, gpr_now(GPR_CLOCK_MONOTONIC), this);
    thread_.join();
  }

 private:
  void Run() {
    void* tag = nullptr;
    bool ok = false;
    cq_.Next(&tag, &ok);  // returns only for wake_
    cq_.Shutdown();
    while (cq_.Next(&tag, &ok)) {
    }
  }

  grpc::CompletionQueue cq_;
  grpc::Alarm wake_;
  std::thread thread_;
};

class GrpcEtcdClient final : public EtcdClient {
 public:
  GrpcEtcdClient(std::vector<Endpoint> endpoints, absl::Duration timeout,
                 std::function<void(const char*, absl::Duration, bool)> on_call,
                 std::unique_ptr<EtcdAuth> auth)
      : endpoints_(std::move(endpoints)),
        timeout_(timeout),
        on_call_(std::move(on_call)),
        auth_(std::move(auth)),
        rotation_(std::make_shared<Rotation>(endpoints_.size())) {}

  absl::StatusOr<EtcdRangeResult> Range(const std::string& key, const std::string& range_end,
                                        int64_t limit) override {
    pb::RangeRequest request;
    request.set_key(RangeStart(key, range_end));
    request.set_range_end(range_end);
    request.set_limit(limit);
    pb::RangeResponse response;
    absl::Status s = Call("Range", [&](Endpoint& e, grpc::ClientContext* context) {
      return e.kv->Range(context, request, &response);
    });
    if (!s.ok()) return s;
    EtcdRangeResult result;
    result.kvs = FromProto(response.kvs());
    result.revision = response.header().revision();
    result.count = response.count();
    return result;
  }

  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value,
                              int64_t lease) override {
    pb::PutRequest request;
    request.set_key(key);
    request.set_value(value);
    request.set_lease(lease);
    pb::PutResponse response;
    absl::Status s = Call("Put", [&](Endpoint& e, grpc::ClientContext* context) {
      return e.kv->Put(context, request, &response);
    });
    if (!s.ok()) return s;
    return response.header().revision();
  }

  absl::StatusOr<int64_t> Delete(const std::string& key, const std::string& range_end) override {
    pb::DeleteRangeRequest request;
    request.set_key(RangeStart(key, range_end));
    request.set_range_end(range_end);
    pb::DeleteRangeResponse response;
    absl::Status s = Call("DeleteRange", [&](Endpoint& e, grpc::ClientContext* context) {
      return e.kv->DeleteRange(context, request, &response);
    });
    if (!s.ok()) return s;
    return response.deleted();
  }

  absl::StatusOr<EtcdTxnResult> Txn(const std::vector<EtcdCompare>& compares,
                                    const std::vector<EtcdOp>& success,
                                    const std::vector<EtcdOp>& failure) override {
    pb::TxnRequest request;
    for (const EtcdCompare& c : compares) *request.add_compare() = ToProto(c);
    for (const EtcdOp& op : success) *request.add_success() = ToProto(op);
    for (const EtcdOp& op : failure) *request.add_failure() = ToProto(op);
    pb::TxnResponse response;
    absl::Status s = Call("Txn", [&](Endpoint& e, grpc::ClientContext* context) {
      return e.kv->Txn(context, request, &response);
    });
    if (!s.ok()) return s;
    EtcdTxnResult result;
    result.succeeded = response.succeeded();
    result.revision = response.header().revision();
    for (const pb::ResponseOp& op : response.responses()) {
      result.ranges.push_back(op.has_response_range() ? FromProto(op.response_range().kvs())
                                                      : std::vector<EtcdKeyValue>());
    }
    return result;
  }

  absl::StatusOr<int64_t> LeaseGrant(absl::Duration ttl) override {
    pb::LeaseGrantRequest request;
    request.set_ttl(std::max<int64_t>(1, absl::Ceil(ttl, absl::Seconds(1)) / absl::Seconds(1)));
    pb::LeaseGrantResponse response;
    absl::Status s = Call("LeaseGrant", [&](Endpoint& e, grpc::ClientContext* context) {
      return e.lease->LeaseGrant(context, request, &response);
    });
    if (!s.ok()) return s;
    if (!response.error().empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("etcd ", endpoint(), ": LeaseGrant: ", response.error()));
    }
    return response.id();
  }

  absl::StatusOr<absl::Duration> LeaseKeepAlive(int64_t lease) override {
    pb::LeaseKeepAliveRequest request;
    request.set_id(lease);
    pb::LeaseKeepAliveResponse response;
    absl::Status s = Call("LeaseKeepAlive", [&](Endpoint& e, grpc::ClientContext* context) {
      // One renewal per call: a stream kept open would be one more thing to
      // fail over; a short one has the unary calls' deadline and retries.
      auto stream = e.lease->LeaseKeepAlive(context);
      const bool answered = stream->Write(request) && stream->Read(&response);
      stream->WritesDone();
      grpc::Status finished = stream->Finish();
      if (finished.ok() && !answered) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the stream ended with no answer");
      }
      return finished;
    });
    if (!s.ok()) return s;
    // etcd answers a lease it doesn't know (expired, revoked) with TTL 0.
    if (response.ttl() <= 0) {
      return absl::NotFoundError(absl::StrCat("etcd ", endpoint(), ": LeaseKeepAlive: lease ",
                                              absl::Hex(lease), " has expired or was revoked"));
    }
    return absl::Seconds(response.ttl());
  }

  absl::Status LeaseRevoke(int64_t lease) override {
    pb::LeaseRevokeRequest request;
    request.set_id(lease);
    pb::LeaseRevokeResponse response;
    return Call("LeaseRevoke", [&](Endpoint& e, grpc::ClientContext* context) {
      return e.lease->LeaseRevoke(context, request, &response);
    });
  }

  std::unique_ptr<EtcdWatch> Watch(const std::string& key, const std::string& range_end,
                                   int64_t start_revision,
                                   std::function<void(const std::vector<EtcdEvent>&)> on_events,
                                   std::function<void(const absl::Status&)> on_error) override {
    pb::WatchCreateRequest request;
    request.set_key(RangeStart(key, range_end));
    request.set_range_end(range_end);
    request.set_start_revision(start_revision);
    const size_t i = rotation_->current();
    // Without a token (etcd unreachable, say) the watch fails as it starts,
    // and says why through on_error.
    std::string token;
    if (auth_) token = auth_->Token(endpoints_[i].channel, timeout_).value_or("");
    return std::make_unique<GrpcEtcdWatch>(endpoints_[i].address, i, endpoints_[i].channel,
                                           rotation_, std::move(request), std::move(on_events),
                                           std::move(on_error), token);
  }

  std::string endpoint() const override { return endpoints_[rotation_->current()].address; }

 private:
  // Runs `attempt` (which makes one RPC with the context it is given) on
  // each endpoint at most once, from the one that last answered, until one
  // answers: its status is returned, its errors named by endpoint and `op`.
  template <typename Attempt>
  absl::Status Call(const char* op, Attempt attempt) {
    const absl::Time start = absl::Now();
    absl::Status s = CallMembers(op, attempt);
    if (on_call_) on_call_(op, absl::Now() - start, s.ok());
    return s;
  }

  template <typename Attempt>
  absl::Status CallMembers(const char* op, Attempt attempt) {
    const size_t first = rotation_->current();
    grpc::Status last;
    for (size_t n = 0; n < endpoints_.size(); ++n) {
      const size_t i = (first + n) % endpoints_.size();
      // A token etcd no longer takes: authenticate again, once.
      for (int tries = 0; tries < 2; ++tries) {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
        if (auth_) {
          absl::StatusOr<std::string> token = auth_->Token(endpoints_[i].channel, timeout_);
          if (!token.ok()) {
            last = grpc::Status(static_cast<grpc::StatusCode>(token.status().code()),
                                std::string(token.status().message()));
            break;
          }
          context.AddMetadata("token", *token);
        }
        last = attempt(endpoints_[i], &context);
        if (!auth_ || !auth_->Refused(last)) break;
      }
      if (MovesOn(last.error_code())) continue;
      rotation_->Answered(i);
      if (last.ok()) return absl::OkStatus();
      return Failure(endpoints_[i].address, op, last);
    }
    std::vector<std::string> addresses;
    for (const Endpoint& e : endpoints_) addresses.push_back(e.address);
    return absl::UnavailableError(absl::StrCat("etcd unreachable at ",
                                               absl::StrJoin(addresses, ", "), ": ", op, ": ",
                                               last.error_message()));
  }

  std::vector<Endpoint> endpoints_;
  const absl::Duration timeout_;
  const std::function<void(const char*, absl::Duration, bool)> on_call_;
  const std::unique_ptr<EtcdAuth> auth_;
  const std::shared_ptr<Rotation> rotation_;
  Poller poller_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(Options options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("etcd: no endpoints");
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("etcd: the call timeout must be positive");
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = MakeCredentials(options);
  if (!credentials.ok()) return credentials.status();
  const grpc::ChannelArguments args = ChannelArgs();
  std::vector<Endpoint> endpoints;
  for (const std::string& address : options.endpoints) {
    // A URL would reach gRPC's resolver as a name it can't resolve, failing
    // every call with a puzzling message.
    if (address.empty() || address.find("://") != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint \"", address, "\": want HOST:PORT"));
    }
    Endpoint e;
    e.address = address;
    e.channel = grpc::CreateCustomChannel(address, *credentials, args);
    e.kv = pb::KV::NewStub(e.channel);
    e.lease = pb::Lease::NewStub(e.channel);
    endpoints.push_back(std::move(e));
  }
  std::unique_ptr<EtcdAuth> auth;
  if (!options.user.empty()) auth = std::make_unique<EtcdAuth>(options.user, options.password);
  return std::unique_ptr<EtcdClient>(new GrpcEtcdClient(
      std::move(endpoints), options.timeout, std::move(options.on_call), std::move(auth)));
}

std::string RangeEndForPrefix(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    const unsigned char last = static_cast<unsigned char>(end.back());
    if (last != 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  // No key is greater than the prefix by a byte: "\0" means "to the end".
  return std::string(1, '\0');
}

}  // namespace ddp
