// Times our communicators' all-reduce (gloo: TCP ring; shm: shared memory) on float32 buffers: one
// process per rank, rendezvous through a shared folder (Gloo's FileStore). Prints one JSON line per
// size on rank 0:
//   {"impl": "ours", "world": 2, "bytes": 4096, "iters": 200, "p50_us": ..., "p10_us": ...,
//   "p90_us": ...}
//
//   ddp_allreduce_bench --rank 0 --world 2 --store /tmp/ar & ddp_allreduce_bench --rank 1 ...
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/process.h"
#include "gloo/allreduce.h"
#include "gloo/math.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "worker/collective/gloo_communicator.h"
#include "worker/collective/shm_communicator.h"

ABSL_FLAG(int32_t, rank, 0, "this process's rank");
ABSL_FLAG(int32_t, world, 2, "number of ranks");
ABSL_FLAG(std::string, store, "/tmp/ddp-allreduce-bench", "folder shared by the ranks");
ABSL_FLAG(std::string, sizes, "4096,65536,1048576,4194304,16777216,67108864",
          "buffer sizes in bytes, comma-separated");
ABSL_FLAG(double, seconds, 1.0, "time to spend per size (at least 5 iterations)");
ABSL_FLAG(std::string, impl, "gloo", "gloo (TCP ring) or shm (shared memory)");
ABSL_FLAG(std::string, host, "127.0.0.1",
          "gloo: the address peers reach this rank at (a test host's, to cross a shaped link)");
ABSL_FLAG(bool, memcpy, false, "print this machine's memcpy bandwidth and exit");

namespace ddp {
namespace {

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * (v.size() - 1))];
}

// One thread copying 64 MiB: the ceiling for moving bytes on this machine.
int Memcpy() {
  std::vector<char> a(64 << 20, 1), b(64 << 20, 2);
  std::vector<double> gbps;
  for (int i = 0; i < 20; ++i) {
    const absl::Time start = absl::Now();
    std::memcpy(b.data(), a.data(), a.size());
    gbps.push_back(a.size() / absl::ToDoubleSeconds(absl::Now() - start) / 1e9);
  }
  std::printf("{\"memcpy_gb_per_s\": %.2f}\n", Percentile(gbps, 0.5));
  return b[123] == 1 ? 0 : 1;
}

int Run() {
  const int rank = absl::GetFlag(FLAGS_rank);
  const int world = absl::GetFlag(FLAGS_world);
  if (absl::GetFlag(FLAGS_memcpy)) return Memcpy();
  gloo::rendezvous::FileStore file_store(absl::GetFlag(FLAGS_store));
  const std::string impl = absl::GetFlag(FLAGS_impl);
  absl::StatusOr<std::unique_ptr<Communicator>> comm;
  if (impl == "shm") {
    ShmCommunicator::Options options;
    options.rank = rank;
    options.world_size = world;
    comm = ShmCommunicator::Create(file_store, options);
  } else {
    GlooCommunicator::Options options;
    options.rank = rank;
    options.world_size = world;
    options.host = absl::GetFlag(FLAGS_host);
    comm = GlooCommunicator::Create(file_store, options);
  }
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", std::string(comm.status().message()).c_str());
    return 1;
  }
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    size_t bytes = 0;
    if (!absl::SimpleAtoi(text, &bytes)) return 2;
    std::vector<float> data(bytes / sizeof(float), 1.0f);
    // Every rank runs the same number of iterations: rank 0 decides.
    int iters = 5;
    {
      const absl::Time start = absl::Now();
      for (int i = 0; i < 3; ++i) (*comm)->AllReduceSum(data.data(), data.size()).IgnoreError();
      const double per = absl::ToDoubleSeconds(absl::Now() - start) / 3;
      iters = std::max(5, static_cast<int>(absl::GetFlag(FLAGS_seconds) / std::max(per, 1e-6)));
      float f = static_cast<float>(rank == 0 ? iters : 0);
      (*comm)->AllReduceSum(&f, 1).IgnoreError();
      iters = static_cast<int>(f);
    }
    std::vector<double> us;
    for (int i = 0; i < iters; ++i) {
      const absl::Time start = absl::Now();
      if (absl::Status s = (*comm)->AllReduceSum(data.data(), data.size()); !s.ok()) {
        std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
        return 1;
      }
      us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
    }
    if (rank == 0) {
      std::printf(
          "{\"impl\": \"ours-%s\", \"world\": %d, \"bytes\": %zu, \"iters\": %d, "
          "\"p50_us\": %.1f, \"p10_us\": %.1f, \"p90_us\": %.1f}\n",
          impl.c_str(), world, bytes, iters, Percentile(us, 0.5), Percentile(us, 0.1),
          Percentile(us, 0.9));
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  ddp::CatchTerminationSignals();
  ddp::ParseFlagsOrExit(argc, argv, "ddp_allreduce_bench: times our all-reduce");
  return ddp::Run();
}
