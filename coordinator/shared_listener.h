// One listening socket for the life of a coordinator that fails over: bound
// once, without SO_REUSEPORT (no other process may share the port), and
// handed from the standby's gRPC server to the leader's without ever
// closing, so a client never finds the port refused (which would set its
// channel backing off for a second) at a takeover. Each connection it
// accepts goes to the server it routes to now (gRPC's external connection
// acceptor).
//
// Thread-safe. The accept loop runs on a thread of its own.
#ifndef DDP_COORDINATOR_SHARED_LISTENER_H_
#define DDP_COORDINATOR_SHARED_LISTENER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/server_builder.h"

namespace ddp {

class SharedListener {
 public:
  // Binds `listen` (HOST:PORT; port 0: one the system picks), or takes up
  // the socket a previous image of this process handed down (HandDown).
  // UNAVAILABLE naming the process that holds the port when it is taken.
  static absl::StatusOr<std::unique_ptr<SharedListener>> Listen(const std::string& listen);
  ~SharedListener();
  SharedListener(const SharedListener&) = delete;
  SharedListener& operator=(const SharedListener&) = delete;

  int port() const { return port_; }

  // New connections go to `acceptor` (a started server's, which it
  // outlives until routed elsewhere); null: they are closed.
  void Route(grpc::experimental::ExternalConnectionAcceptor* acceptor);

  // Stops accepting and leaves the socket open across an exec of this
  // process, named in the environment: the next image's Listen takes it up,
  // and connections wait in its backlog meanwhile.
  void HandDown();

  // The environment variable that names a socket handed down.
  static constexpr char kHandedDownFd[] = "DDP_COORDINATOR_LISTEN_FD";

 private:
  SharedListener(int fd, int port, int wake_read, int wake_write);
  void AcceptLoop();
  void StopLoop();

  const int fd_;
  const int port_;
  // Written to stop the loop.
  const int wake_read_, wake_write_;
  absl::Mutex mu_;
  grpc::experimental::ExternalConnectionAcceptor* route_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

}  // namespace ddp

#endif  // DDP_COORDINATOR_SHARED_LISTENER_H_
