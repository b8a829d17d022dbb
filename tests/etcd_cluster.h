// A real etcd cluster for tests: N members (1 or 3) on free loopback ports,
// each in its own temporary folder (data/ and etcd.log, read it when a test
// fails), with timings short enough that an election takes under a second.
// Members are killed (SIGKILL) and the folders removed on destruction.
//
// Not thread-safe: call it from the thread that created it. Members are
// started with PR_SET_PDEATHSIG, so they die with the thread that started
// them, and never outlive a crashed test.
#ifndef DDP_TESTS_ETCD_CLUSTER_H_
#define DDP_TESTS_ETCD_CLUSTER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ddp {

class EtcdCluster {
 public:
  // How long Start and Restart wait for every member to answer.
  static constexpr absl::Duration kStartTimeout = absl::Seconds(20);

  // Starts `members` members and waits until each answers a read. Ports are
  // chosen free just before; a member that exits at start (a port taken
  // meanwhile) makes it try again with new ones, three times at most.
  // FAILED_PRECONDITION when etcd is not installed; UNAVAILABLE, with the
  // member's log, when the cluster does not come up.
  static absl::StatusOr<std::unique_ptr<EtcdCluster>> Start(int members);
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  // "127.0.0.1:PORT" of each member, in member order.
  std::vector<std::string> client_endpoints() const;

  // SIGKILL, and waits for it to die. Nothing when already dead.
  void Kill(int i);
  // SIGSTOP / SIGCONT: the member hangs with its sockets open.
  void Stop(int i);
  void Cont(int i);
  // Kills member `i` if it runs, starts it again on its data and ports
  // (--initial-cluster-state existing), and waits until it answers.
  absl::Status Restart(int i);

  // The member's log (its stderr), for failure messages.
  std::string Log(int i) const;

 private:
  struct Member {
    std::string name;
    std::string dir;  // data/ and etcd.log
    int client_port = 0;
    int peer_port = 0;
    pid_t pid = -1;
  };

  EtcdCluster(std::string etcd, std::string base)
      : etcd_(std::move(etcd)), base_(std::move(base)) {}
  absl::Status Spawn(int i, bool existing);
  // Until each of `members` answers a read, or one exits (ABORTED), or the
  // timeout (UNAVAILABLE).
  absl::Status WaitReady(const std::vector<int>& members, absl::Duration timeout);

  const std::string etcd_;  // the binary
  const std::string base_;  // a temporary folder, removed at the end
  std::string token_;       // --initial-cluster-token
  std::vector<Member> members_;
};

}  // namespace ddp

#endif  // DDP_TESTS_ETCD_CLUSTER_H_
