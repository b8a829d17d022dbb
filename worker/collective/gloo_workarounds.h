// What running Debian's Gloo (0.0~git20220518) inside a long-lived daemon
// takes, where peers die and abort at any moment: see gloo_workarounds.cc.
#ifndef DDP_WORKER_COLLECTIVE_GLOO_WORKAROUNDS_H_
#define DDP_WORKER_COLLECTIVE_GLOO_WORKAROUNDS_H_

namespace ddp {

// Call before creating a Gloo context (idempotent, thread-safe): ignores
// SIGPIPE, so that Gloo writing to a peer that has gone returns an error
// instead of killing the process. Linking it in also brings the
// getpeername() shim described in the .cc file.
void PrepareProcessForGloo();

}  // namespace ddp

#endif  // DDP_WORKER_COLLECTIVE_GLOO_WORKAROUNDS_H_
