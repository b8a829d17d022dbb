// Which transport a generation's ranks talk over: the job's backend, with
// "auto" resolved. A pure function of what every member's assignment says
// alike (and this rank's device kind, the same on every rank NCCL is picked
// for), so that all ranks choose the same.
#ifndef DDP_WORKER_COLLECTIVE_TRANSPORT_CHOICE_H_
#define DDP_WORKER_COLLECTIVE_TRANSPORT_CHOICE_H_

#include <string>

#include "common/device.h"
#include "ddp/v1/worker.pb.h"

namespace ddp {

enum class Transport { kShm, kHierarchical, kNccl, kGloo };

struct TransportChoice {
  Transport transport = Transport::kGloo;
  // Why, for the log: "auto: nccl, every rank has its own GPU".
  std::string why;
};

// "auto": NCCL only when every rank has a GPU of its own (the coordinator
// says so in Assignment.own_gpus); else shared memory when every rank is on
// one machine, shared memory within machines and Gloo among their leaders
// when several machines hold several ranks, else Gloo.
TransportChoice ChooseTransport(const v1::Assignment& a, const Device& device);

const char* TransportName(Transport t);

}  // namespace ddp

#endif  // DDP_WORKER_COLLECTIVE_TRANSPORT_CHOICE_H_
