// The ddp library: your own LibTorch training loop, data-parallel.
//   find_package(ddp CONFIG REQUIRED)
//   target_link_libraries(app PRIVATE ddp::ddp)
#ifndef DDP_INCLUDE_DDP_DDP_H_
#define DDP_INCLUDE_DDP_DDP_H_

#include "ddp/disk_dataset.h"               // IWYU pragma: export
#include "ddp/distributed_data_parallel.h"  // IWYU pragma: export
#include "ddp/distributed_sampler.h"        // IWYU pragma: export
#include "ddp/error.h"                      // IWYU pragma: export
#include "ddp/session.h"                    // IWYU pragma: export
#include "ddp/version.h"                    // IWYU pragma: export

#endif  // DDP_INCLUDE_DDP_DDP_H_
