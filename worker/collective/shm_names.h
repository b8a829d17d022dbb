// The names of shared-memory segments this process created and has not
// unlinked yet (rank 0's, until every rank mapped the segment): a SIGTERM
// or SIGINT then unlinks them before the process dies, so nothing is left
// in /dev/shm. The handler is installed only where the signal's
// disposition is still the default (a program's own handler is kept), and
// it ends the process as the default would, by re-raising the signal.
// A segment left anyway (kill -9) is removed by the next rendezvous on the
// machine (ShmCommunicator::RemoveStaleSegments).
#ifndef DDP_WORKER_COLLECTIVE_SHM_NAMES_H_
#define DDP_WORKER_COLLECTIVE_SHM_NAMES_H_

#include <string>

namespace ddp {

// Holds `name` ("/ddp-...") for the signal handlers while it lives.
class PendingShmName {
 public:
  explicit PendingShmName(const std::string& name);
  ~PendingShmName();
  PendingShmName(const PendingShmName&) = delete;
  PendingShmName& operator=(const PendingShmName&) = delete;

 private:
  int slot_ = -1;  // -1: no slot was free (then only the next rendezvous)
};

}  // namespace ddp

#endif  // DDP_WORKER_COLLECTIVE_SHM_NAMES_H_
