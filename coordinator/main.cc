// ddp-coordinator: assigns ranks, epochs and sampler seeds to workers, serves
// their rendezvous store, and shows operators the whole job.
#include <malloc.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "common/process.h"
#include "coordinator/coordinator.h"
#include "coordinator/health_service.h"
#include "coordinator/service.h"
#include "coordinator/state_store.h"
#include "coordinator/status_watchers.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "worker/preflight.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:29400",
          "address:port to serve on; port 0 picks a free port (see --port_file)");
ABSL_FLAG(std::string, job, "", "JobSpec file (protobuf JSON) to run at start");
ABSL_FLAG(std::string, state_dir, "",
          "directory where the job and generation numbers survive restarts (none: memory only)");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(1),
          "how often workers send heartbeats");
ABSL_FLAG(absl::Duration, heartbeat_timeout, absl::Seconds(5), "a worker silent this long is lost");
ABSL_FLAG(absl::Duration, adopt_grace, absl::Seconds(10),
          "after a restart, how long the saved generation's members have to come back before it "
          "is re-formed without the missing ones");
ABSL_FLAG(bool, exit_when_done, false,
          "when the job ends, stop every worker and exit: 0 if it succeeded, 1 if it failed, "
          "3 if it was cancelled");
ABSL_FLAG(std::string, port_file, "", "write the port served on to this file once serving");
ABSL_FLAG(uint32_t, max_attach_streams, 20000,
          "most worker (Attach) streams open at once, registered or not; more are refused "
          "with RESOURCE_EXHAUSTED");
ABSL_FLAG(absl::Duration, register_deadline, absl::Seconds(10),
          "an Attach stream that sends no RegisterRequest this long after opening is closed "
          "with DEADLINE_EXCEEDED");
ABSL_FLAG(uint32_t, max_watch_streams, 64,
          "most WatchStatus streams open at once; more are refused with RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, status_file, "",
          "on exit, write the final GetStatus answer to this file (protobuf JSON)");

namespace ddp {
namespace {

constexpr char kUsage[] =
    "ddp-coordinator: assigns ranks to ddp-worker daemons and watches the job.\n"
    "  ddp-coordinator --listen 0.0.0.0:29400 --job job.json --state-dir /var/lib/ddp\n"
    "Operators: grpcurl -plaintext HOST:29400 ddp.v1.Coordinator/GetStatus";

int ExitCodeFor(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_SUCCEEDED:
      return 0;
    case v1::JOB_STATE_CANCELLED:
      return 3;
    default:
      return 1;
  }
}

// glibc keeps what a flood of calls freed (thousands of gRPC call arenas,
// spread over every thread's malloc arena) for reuse, so an idle
// coordinator would hold its peak for hours. Hands free pages back.
void ReturnFreeMemory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

int Run() {
  SetLogIdentity("coordinator");
  Coordinator::Options options;
  options.build = ThisBuild();
  options.registry.heartbeat_timeout = absl::GetFlag(FLAGS_heartbeat_timeout);
  options.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  if (options.heartbeat_interval <= absl::ZeroDuration() ||
      options.registry.heartbeat_timeout <= options.heartbeat_interval) {
    DDP_LOG(Error) << "--heartbeat_timeout must be longer than --heartbeat_interval > 0";
    return 2;
  }
  options.adopt_grace = absl::GetFlag(FLAGS_adopt_grace);
  options.streams.max_streams = absl::GetFlag(FLAGS_max_attach_streams);
  options.streams.register_deadline = absl::GetFlag(FLAGS_register_deadline);
  if (options.streams.max_streams == 0 ||
      options.streams.register_deadline <= absl::ZeroDuration()) {
    DDP_LOG(Error) << "--max_attach_streams and --register_deadline must be positive";
    return 2;
  }
  options.preflight = PreflightJob;
  std::unique_ptr<StateStore> state_store;
  if (const std::string dir = absl::GetFlag(FLAGS_state_dir); !dir.empty()) {
    auto opened = StateStore::Open(dir);
    if (!opened.ok()) {
      DDP_LOG(Error) << "--state_dir: " << opened.status().message();
      return 2;
    }
    state_store = std::move(*opened);
    options.state_store = state_store.get();
  }
  Coordinator core(RealClock::Get(), options);
  if (state_store) {
    auto saved = state_store->Load();
    if (!saved.ok()) {
      DDP_LOG(Error) << saved.status().message();
      return 2;
    }
    if (saved->has_value()) {
      core.Restore(**saved);
      DDP_LOG(Info) << "restored state from " << state_store->path();
    }
  }
  if (const std::string path = absl::GetFlag(FLAGS_job); !path.empty()) {
    auto spec = LoadJobSpecFile(path, options.build);
    if (spec.ok()) spec = core.SubmitJob(*spec);
    if (!spec.ok()) {
      DDP_LOG(Error) << "--job " << path << ": " << spec.status().message();
      return 2;
    }
  }

  StatusWatchers watchers(absl::GetFlag(FLAGS_max_watch_streams));
  CoordinatorService service(&core, &watchers);
  HealthService health;
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.RegisterService(&health);
  // Notice dead peers on idle connections too, not only silent heartbeats.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    DDP_LOG(Error) << "can't listen on " << absl::GetFlag(FLAGS_listen)
                   << " (address in use, or not an address of this host?)";
    return 1;
  }
  if (const std::string file = absl::GetFlag(FLAGS_port_file); !file.empty()) {
    std::ofstream(file + ".tmp") << port << "\n";
    std::rename((file + ".tmp").c_str(), file.c_str());
  }
  DDP_LOG(Info) << "serving ddp.v1.Coordinator on port " << port << " (listen "
                << absl::GetFlag(FLAGS_listen) << ")";

  std::atomic<bool> stopping{false};
  std::thread ticker([&] {
    absl::Time trimmed = absl::Now();
    while (!stopping) {
      core.Tick();
      const absl::Time now = absl::Now();
      watchers.Broadcast(core.Snapshot(), now);
      if (now - trimmed >= absl::Seconds(5)) {
        ReturnFreeMemory();
        trimmed = now;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  });

  int exit_code = 0;
  absl::Time ended_at = absl::InfiniteFuture();
  while (true) {
    if (int sig = WaitForTermination(absl::Milliseconds(100)); sig != 0) {
      DDP_LOG(Info) << "got " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << "; shutting down";
      break;
    }
    if (!absl::GetFlag(FLAGS_exit_when_done)) continue;
    const auto snapshot = core.Snapshot();
    const v1::JobState state = snapshot->state();
    const bool ended = state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
                       state == v1::JOB_STATE_CANCELLED;
    if (!ended) continue;
    if (ended_at == absl::InfiniteFuture()) {
      ended_at = absl::Now();
      exit_code = ExitCodeFor(state);
      DDP_LOG(Info) << "job ended (" << v1::JobState_Name(state) << ": " << snapshot->message()
                    << "); stopping workers";
      core.StopAllWorkers("the job ended and the coordinator exits");
    }
    // Give workers a moment to take the stop and hang up.
    if (snapshot->attached_workers() == 0 || absl::Now() - ended_at > absl::Seconds(3)) break;
  }
  if (const std::string file = absl::GetFlag(FLAGS_status_file); !file.empty()) {
    core.Tick();  // publish the latest state
    std::string json;
    google::protobuf::util::MessageToJsonString(*core.Snapshot(), &json);
    std::ofstream(file + ".tmp") << json << "\n";
    std::rename((file + ".tmp").c_str(), file.c_str());
  }
  health.SetServing(false);
  // Streams close as the server stops: that is not the workers' doing, and
  // the generation they train in must survive for the next start to adopt.
  core.BeginShutdown();
  core.FlushState();
  watchers.FinishAll();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  stopping = true;
  ticker.join();
  DDP_LOG(Info) << "stopped";
  return exit_code;
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  ddp::CatchTerminationSignals();
  ddp::ParseFlagsOrExit(argc, argv, ddp::kUsage);
  return ddp::Run();
}
