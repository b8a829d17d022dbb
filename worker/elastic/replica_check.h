// The one check that every rank holds the same model before anything moves
// between them, for the daemon's trainer and the library's
// DistributedDataParallel alike: names and shapes of the parameters, and of
// the buffers with their dtypes, compared with rank `root`'s, each rank
// naming where it first differs.
#ifndef DDP_WORKER_ELASTIC_REPLICA_CHECK_H_
#define DDP_WORKER_ELASTIC_REPLICA_CHECK_H_

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "worker/collective/communicator.h"

namespace ddp {

// A collective over `comm`: every rank calls it with the same `root`.
//   INVALID_ARGUMENT  on every rank at once: "the ranks' models differ: rank
//                     1 at parameter #3 (rank 0 has fc.weight [10, 32]).
//                     This rank (1) has fc.weight [10, 64]. Every rank must
//                     build the same model"
//   DATA_LOSS         `root` announced a list longer than any model's
//                     (refused before allocating)
//   the communicator's errors as they come.
absl::Status CheckSameModel(Communicator& comm,
                            const std::vector<std::pair<std::string, at::Tensor>>& params,
                            const std::vector<std::pair<std::string, at::Tensor>>& buffers,
                            int root);

}  // namespace ddp

#endif  // DDP_WORKER_ELASTIC_REPLICA_CHECK_H_
