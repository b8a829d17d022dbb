#include "coordinator/failover.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/net_address.h"
#include "common/port_holder.h"
#include "common/process.h"
#include "common/state_seal.h"
#include "coordinator/etcd_state_store.h"
#include "coordinator/health_service.h"
#include "coordinator/leader_election.h"
#include "coordinator/shared_listener.h"
#include "coordinator/standby_service.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace ddp {
namespace {

// How a standby forwards reads to the leader: its own certificate, trusting
// --tls_ca (coordinators of one cluster share a CA); plaintext without TLS.
absl::StatusOr<ClientSecurity> ToLeaderSecurity(const HttpAccess& http) {
  if (http.tls_cert.empty()) return ClientSecurity();
  return LoadClientSecurity(TlsFlags{http.tls_cert, http.tls_key, http.tls_ca}, "");
}

// Calls `step` until it succeeds or fails for good (not UNAVAILABLE or
// DEADLINE_EXCEEDED), waiting between tries and telling `election` why
// (its refusals say so); returns its last status, or CANCELLED on SIGINT
// or SIGTERM.
absl::Status RetryWhileUnreachable(const std::string& what,
                                   const std::function<absl::Status()>& step,
                                   LeaderElection& election) {
  absl::Duration backoff = absl::Milliseconds(200);
  absl::Time complained = absl::InfinitePast();
  while (true) {
    absl::Status s = step();
    election.NoteEtcdTrouble(s.ok() ? "" : std::string(s.message()));
    if (s.ok() || (!absl::IsUnavailable(s) && !absl::IsDeadlineExceeded(s))) return s;
    // Said at once, then every 30 s while it lasts.
    if (absl::Now() - complained >= absl::Seconds(30)) {
      complained = absl::Now();
      DDP_LOG(Warning) << what << ": " << s.message() << "; trying again every "
                       << absl::FormatDuration(backoff) << " up to 5s";
    }
    if (WaitForTermination(backoff) != 0) return absl::CancelledError("terminated");
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
}

// ddp_coordinator_etcd_request_seconds{op}: every call to etcd, timed.
std::function<void(const char*, absl::Duration, bool)> TimeEtcdCalls(
    std::shared_ptr<prometheus::Registry> registry) {
  auto& family = prometheus::BuildHistogram()
                     .Name("ddp_coordinator_etcd_request_seconds")
                     .Help("etcd calls of this coordinator (over every member tried), by call")
                     .Register(*registry);
  // The registry lives as long as the client that calls this: the
  // election's last call (resigning) comes after the metrics are gone.
  return [registry, &family](const char* op, absl::Duration took, bool /*ok*/) {
    static const prometheus::Histogram::BucketBoundaries kBuckets = {
        0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2};
    family.Add({{"op", op}}, kBuckets).Observe(absl::ToDoubleSeconds(took));
  };
}

}  // namespace

int RunWithFailover(CoordinatorServer::Options options, const FailoverOptions& failover,
                    const std::function<void(int port)>& start_over) {
  options.extra_metrics = std::make_shared<prometheus::Registry>();
  EtcdClient::Options etcd_options = failover.etcd;
  etcd_options.on_call = TimeEtcdCalls(options.extra_metrics);
  absl::StatusOr<std::unique_ptr<EtcdClient>> etcd = EtcdClient::Create(etcd_options);
  if (!etcd.ok()) {
    DDP_LOG(Error) << "--etcd_endpoints: " << etcd.status().message();
    return 2;
  }
  absl::StatusOr<StateSeal> seal = failover.state_key_file.empty()
                                       ? StateSeal::LocalDefault()
                                       : StateSeal::FromFile(failover.state_key_file);
  if (!seal.ok()) {
    DDP_LOG(Error) << seal.status().message();
    return 2;
  }
  if (failover.state_key_file.empty()) {
    DDP_LOG(Info) << "the state in etcd is sealed with " << seal->source()
                  << " (this user's on this machine): give coordinators on other machines a copy "
                     "(--state_key_file)";
  }
  absl::StatusOr<ClientSecurity> to_leader = ToLeaderSecurity(options.security.http);
  if (!to_leader.ok()) {
    DDP_LOG(Error) << to_leader.status().message();
    return 2;
  }
  LeaderElection election(etcd->get(), RealClock::Get(), {failover.prefix, failover.lease_ttl});

  // The standby's server, on the port the leader's will take over.
  StandbyService standby(&election, std::move(*to_leader));
  HealthService health;
  health.SetStandby(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // The port, held for this process's whole life: the standby's server
  // has its connections, then the leader's (SharedListener).
  absl::StatusOr<std::unique_ptr<SharedListener>> listener = SharedListener::Listen(options.listen);
  if (!listener.ok()) {
    DDP_LOG(Error) << listener.status().message();
    return absl::IsInvalidArgument(listener.status()) ? 2 : 1;
  }
  const int port = (*listener)->port();
  grpc::ServerBuilder builder;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor =
      builder.experimental().AddExternalConnectionAcceptor(
          grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
          options.security.credentials);
  builder.RegisterService(&standby);
  builder.RegisterService(&health);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) {
    DDP_LOG(Error) << "can't serve the standby on " << options.listen;
    return 1;
  }
  (*listener)->Route(acceptor.get());
  absl::StatusOr<HostPort> listen = ParseHostPort(options.listen, /*allow_port_zero=*/true);
  if (listen.ok()) options.listen = JoinHostPort(listen->host, port);
  std::string advertise = failover.advertise;
  if (advertise.empty()) {
    if (!listen.ok() || IsWildcardHost(listen->host)) {
      DDP_LOG(Error) << "--listen " << options.listen
                     << " names no address clients can dial: set --advertise_address";
      return 2;
    }
    advertise = options.listen;
  }
  const std::string endpoints = absl::StrJoin(failover.etcd.endpoints, ",");
  DDP_LOG(Info) << "standby on port " << port << " (as " << advertise << "), state in etcd at "
                << endpoints << " under " << failover.prefix;

  absl::Status s = RetryWhileUnreachable(
      absl::StrCat("etcd at ", endpoints),
      [&] { return EtcdStateStore::ClaimPrefix(etcd->get(), failover.prefix); }, election);
  if (s.ok()) {
    s = RetryWhileUnreachable(
        absl::StrCat("campaign in etcd at ", endpoints), [&] { return election.Start(advertise); },
        election);
  }
  if (absl::IsCancelled(s)) return 0;
  if (!s.ok()) {
    DDP_LOG(Error) << s.message();
    return 2;
  }
  while (!election.AwaitLeadership(absl::Milliseconds(50))) {
    if (WaitForTermination(absl::ZeroDuration()) != 0) {
      election.Stop(/*resign=*/true);
      return 0;
    }
  }
  DDP_LOG(Info) << "leading: loading the state from etcd and taking over";
  auto store = std::make_unique<EtcdStateStore>(etcd->get(), failover.prefix, &election, *seal);
  if (absl::Status trusted = store->Load().status();
      absl::IsPermissionDenied(trusted) || absl::IsDataLoss(trusted)) {
    // State that this coordinator can't trust or read is not run, and not
    // overwritten either (an operator decides): it stays up as a standby,
    // says why, and stands again in a while.
    DDP_LOG(Error)
        << "refusing to lead: " << trusted.message()
        << ". Restore it, or remove it to start fresh (etcdctl del " << failover.prefix
        << "/state), or give the coordinators' key (--state_key_file); standing again in "
        << absl::FormatDuration(failover.refused_retry);
    election.Stop(/*resign=*/true);
    if (WaitForTermination(failover.refused_retry) != 0) return 0;
    (*listener)->HandDown();
    start_over(port);
    return 1;
  }
  options.state_store = std::move(store);
  options.leadership = &election;
  // The leader's server takes the port's connections over once it serves
  // (the port never closes meanwhile), and only then does the standby's go.
  options.listener = listener->get();
  CoordinatorServer coordinator(std::move(options));
  const absl::Status started = coordinator.Start();
  if (!started.ok()) (*listener)->Route(nullptr);  // it may still be the standby's
  server->Shutdown(std::chrono::system_clock::now());
  server.reset();
  if (!started.ok()) {
    DDP_LOG(Error) << started.message();
    // A failure of the term (etcd lost while loading, say): campaign again.
    if (!election.IsLeader() || absl::IsUnavailable(started)) {
      (*listener)->HandDown();
      start_over(port);
    }
    election.Stop(/*resign=*/true);
    return coordinator.failure_exit_code();
  }
  const int code = coordinator.Wait();
  if (code == CoordinatorServer::kLostLeadership) {
    DDP_LOG(Warning) << "no longer the leader (" << election.loss_reason()
                     << "); starting over as a standby";
    // Its key goes now, not when etcd expires the lease (which it may not
    // have yet: a leader stops acting before): a standby takes over at once.
    election.Stop(/*resign=*/true);
    // The port stays open through the exec: clients wait in its backlog
    // for the standby the next image starts.
    (*listener)->HandDown();
    start_over(port);
  }
  coordinator.Stop();
  election.Stop(/*resign=*/true);
  return code;
}

}  // namespace ddp
