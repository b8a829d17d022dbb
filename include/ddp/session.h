// One process's place in a data-parallel job: its rank, the world size, and
// the communicator its gradients are all-reduced over.
//
// A session starts in one of two ways:
//
// - Joined to a coordinator (DDP_COORDINATOR=HOST:PORT, as ddp-run --
//   PROGRAM sets it, or Options::coordinator): it attaches as a worker does
//   (registration, heartbeats, reconnects) and the coordinator assigns its
//   rank, world size, generation, starting epoch and sampler seed, under a
//   job with model.kind "program". report_step() feeds the coordinator's
//   status, page and metrics without blocking the step; finish() (or the
//   destructor) tells it this rank is done, and the job succeeds once every
//   rank is. When the coordinator ends the generation (a lost peer, a
//   cancelled or failed job), the next collective throws ddp::Error with
//   its reason at once, instead of waiting for a timeout.
// - From torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR and
//   MASTER_PORT (LOCAL_RANK and LOCAL_WORLD_SIZE optional), and
//   DDP_STORE_SECRET. Rank 0 serves the rendezvous at
//   MASTER_ADDR:MASTER_PORT, to callers with that secret only (else any
//   local user could write to it); DDP_ALLOW_ANONYMOUS_STORE=1 instead
//   serves everyone.
//
// Either way every rank then connects to every other: through shared memory
// when all ranks are on this machine, else Gloo over TCP.
// DDP_BACKEND=gloo|shm chooses in the torchrun way; a job's backend does
// with a coordinator.
//
// Thread rules: one thread uses a session and what it made (the
// DistributedDataParallel, collectives) at a time.
#ifndef DDP_INCLUDE_DDP_SESSION_H_
#define DDP_INCLUDE_DDP_SESSION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <torch/types.h>

namespace torch::jit {
struct Module;
}
namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace ddp {

class Communicator;
struct LibraryInternals;

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
    // Bounds the rendezvous and every collective, in seconds; with a
    // coordinator, also the wait for a rank and, after finish(), for the
    // other ranks to finish.
    double timeout_seconds = 300;
    // The secret every rank presents to rank 0's rendezvous (rank 0 serves
    // only callers with it): the same on every rank, at least 16
    // characters, e.g. openssl rand -hex 16. Empty: Start throws, saying
    // to set it, unless allow_anonymous_store.
    std::string store_secret;
    // Serve (and use) the rendezvous without a secret: any user who can
    // reach MASTER_ADDR:MASTER_PORT can then write to it.
    bool allow_anonymous_store = false;

    // Set: join this coordinator (HOST:PORT, or a comma list of several,
    // of which the leader is followed) instead; rank, world_size,
    // master_addr, master_port and backend are then the job's.
    std::string coordinator;
    // For a coordinator that asks for them: a file holding the worker
    // token, and PEM files for TLS (the CA, and a client certificate and
    // key for mutual TLS).
    std::string token_file;
    std::string tls_ca;
    std::string tls_cert;
    std::string tls_key;
    // The name the coordinator shows; empty: the program's name and
    // local_rank.
    std::string name;
  };

  // Joins the coordinator DDP_COORDINATOR names (with DDP_TOKEN_FILE,
  // DDP_TLS_CA, DDP_TLS_CERT, DDP_TLS_KEY, DDP_NAME, LOCAL_RANK), or else
  // starts from torchrun's variables (with DDP_STORE_SECRET, or
  // DDP_ALLOW_ANONYMOUS_STORE=1); DDP_TIMEOUT_SECONDS sets the timeout. Throws ddp::Error
  // naming what is missing or malformed (and what to set), or why joining failed.
  static std::unique_ptr<Session> FromEnvironment();
  // Throws ddp::Error for bad options, when the coordinator refuses this
  // program or assigns no rank in time, or when the peers don't all arrive
  // within the timeout.
  static std::unique_ptr<Session> Start(const Options& options);
  // finish()es a joined session; while an exception unwinds the program,
  // tells the coordinator the job failed instead.
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int rank() const;
  int world_size() const;
  int local_rank() const;
  // Where this rank trains: cuda:LOCAL_RANK when this LibTorch has CUDA and
  // the machine has that GPU, else the CPU. Move the model there before
  // constructing DistributedDataParallel, and each batch before forward.
  torch::Device device() const;
  // The transport gradients cross: "shm" or "gloo".
  std::string backend() const;
  // From the coordinator's assignment; without a coordinator: "", 0, and
  // the defaults PyTorch's DistributedSampler has (seed 0, epoch 0). After
  // set_elastic_state, start_epoch is the epoch of the state taken up.
  std::string job_id() const;
  // Changes exactly when the job re-forms (set_elastic_state).
  uint64_t generation() const;
  uint64_t sampler_seed() const;
  uint64_t start_epoch() const;

  // A step this rank finished, with its loss and samples, for the
  // coordinator's view of the job (status, status page, metrics): queued,
  // never blocks; the last DistributedDataParallel's reduction goes with
  // it. Without a coordinator it does nothing.
  void report_step(double loss, uint64_t samples, uint64_t epoch = 0);
  // This rank is done: tells the coordinator and waits (at most the
  // timeout) until every rank is, so that its going is not taken for a
  // fault. Then throws ddp::Error with the job's message if the job did not
  // succeed (it failed, say when replicas diverged, or was cancelled), so
  // that the program exits non-zero; the destructor, which can't throw,
  // only logs it. Idempotent; without a coordinator it does nothing.
  void finish();

  // Elastic training: what must travel when the job re-forms.
  struct ElasticState {
    // Its parameters and buffers (the DistributedDataParallel's module).
    std::shared_ptr<torch::nn::Module> module;
    // Its state: SGD's momentum, Adam's or AdamW's moments (another kind
    // is a ddp::Error); may be null.
    torch::optim::Optimizer* optimizer = nullptr;
    // The program's own (a scheduler's step, counters), as bytes it writes
    // and reads back itself (at most 64 MiB; the library never interprets
    // them); may be empty.
    std::function<std::string()> save;
    std::function<void(const std::string&)> load;
    // Or, instead of `module`, a TorchScript module's parameters and
    // buffers (the caller's: it outlives the session).
    torch::jit::Module* script_module = nullptr;
  };
  // Call once, after the DistributedDataParallel, the DistributedSampler
  // and the optimizer exist; one of `module` and `script_module` is
  // required (a ddp::Error otherwise). From then on, when a rank is lost or
  // one joins, the job re-forms with no other code, each rank right after
  // the collective in which it met the change: a synchronized backward that
  // failed (its step is dropped; it re-forms at the sampler's next batch), a
  // collective of the program's own (cut short, it keeps this rank's values;
  // it re-forms inside it), or, to admit a joiner, a step every rank
  // completed (at the sampler's next batch). A rank told between
  // collectives goes on to its next one, which fails at once. After an
  // epoch's last batch the sampler's next batch is the next epoch's first,
  // so that the code between epochs runs in the generation that trained the
  // epoch, unless that epoch's last step was dropped: the pass then goes on
  // with it; if that step completed on some ranks only (a fault between
  // their last transfers), the others' next collective (the code between
  // epochs) was cut short, and a rank that dropped it skips its own next
  // one, keeping its values. A step left open across an epoch's end
  // (no_sync() micro-batches at the end of one pass) goes on at the start
  // of the pass the program's loop is in: the earlier pass's open
  // micro-batches are dropped with it.
  // The step in flight is dropped (its backward returns with zero
  // gradients, and what the optimizer then does is undone), every rank
  // takes the state of the rank that completed the most steps, and the rest
  // of the epoch is split among the new world. A program started into a
  // running job takes up that state here; start_epoch() then says where to
  // begin, and until here its own collectives (all_reduce_sum, broadcast,
  // barrier) do nothing: the others are past that point. Re-forming in the
  // middle of a no_sync() accumulation restarts the accumulation: the
  // gradients accumulated so far are dropped (the group's batches are
  // trained again within an epoch), and generation() has changed, which is
  // how a loop that counts its micro-batches knows to start its count over:
  //
  //   uint64_t generation = session->generation();
  //   int micro = 0;
  //   for (auto& batch : *loader) {  // a re-formation happens here
  //     if (session->generation() != generation) {
  //       generation = session->generation();
  //       micro = 0;  // the group starts over
  //     }
  //     ...
  //   }
  //
  // Without a coordinator it does nothing.
  void set_elastic_state(ElasticState state);

  // In place: the sum over the ranks (a contiguous float32 tensor; a GPU's
  // is staged through host memory).
  void all_reduce_sum(torch::Tensor& tensor);
  // In place: rank `root`'s values on every rank.
  void broadcast(torch::Tensor& tensor, int root = 0);
  // Returns once every rank called it.
  void barrier();

  // The communicator under the collectives (for the library's own use).
  Communicator& communicator();

  struct Impl;  // the library's own

 private:
  friend class DistributedDataParallel;
  friend class DistributedSampler;
  friend struct LibraryInternals;  // the worker daemon's trainer
  explicit Session(std::unique_ptr<Impl> impl);
  static std::unique_ptr<Impl> Join(const Options& options);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp

#endif  // DDP_INCLUDE_DDP_SESSION_H_
