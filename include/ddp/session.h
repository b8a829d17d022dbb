// One process's place in a data-parallel job: its rank, the world size, and
// the communicator its gradients are all-reduced over.
//
// Today a session starts the way torchrun starts a script: from RANK,
// WORLD_SIZE, MASTER_ADDR and MASTER_PORT (LOCAL_RANK and LOCAL_WORLD_SIZE
// optional). Rank 0 serves the rendezvous at MASTER_ADDR:MASTER_PORT; every
// rank publishes its address there and connects to every other: through
// shared memory when all ranks are on this machine (LOCAL_WORLD_SIZE ==
// WORLD_SIZE), else Gloo over TCP. DDP_BACKEND=gloo|shm chooses.
//
// Thread rules: one thread uses a session and what it made (the
// DistributedDataParallel, collectives) at a time.
#ifndef DDP_INCLUDE_DDP_SESSION_H_
#define DDP_INCLUDE_DDP_SESSION_H_

#include <cstdint>
#include <memory>
#include <string>

#include <torch/types.h>

namespace ddp {

class Communicator;

class Session {
 public:
  struct Options {
    int rank = 0;
    int world_size = 1;
    // Where rank 0 serves the rendezvous (and every rank finds it).
    std::string master_addr = "127.0.0.1";
    int master_port = 29500;
    int local_rank = 0;
    // Ranks on this machine; 0: unknown (then not all of them).
    int local_world_size = 0;
    // "auto": shared memory when every rank is on this machine, else gloo;
    // or "gloo", "shm".
    std::string backend = "auto";
    // The address peers reach this rank at; empty: the one this host uses
    // to reach master_addr.
    std::string host;
    // Bounds the rendezvous and every collective, in seconds.
    double timeout_seconds = 300;
  };

  // From torchrun's environment variables. Throws ddp::Error naming what is
  // missing or malformed (and what to set), or why the rendezvous failed.
  static std::unique_ptr<Session> FromEnvironment();
  // Throws ddp::Error for bad options, or when the peers don't all arrive
  // within the timeout.
  static std::unique_ptr<Session> Start(const Options& options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int rank() const;
  int world_size() const;
  int local_rank() const;
  // The transport gradients cross: "shm" or "gloo".
  std::string backend() const;

  // In place: the sum over the ranks (a contiguous float32 CPU tensor).
  void all_reduce_sum(torch::Tensor& tensor);
  // In place: rank `root`'s values on every rank.
  void broadcast(torch::Tensor& tensor, int root = 0);
  // Returns once every rank called it.
  void barrier();

  // The communicator under the collectives (for the library's own use).
  Communicator& communicator();

 private:
  struct Impl;
  explicit Session(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp

#endif  // DDP_INCLUDE_DDP_SESSION_H_
