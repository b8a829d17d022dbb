#ifndef DDP_WORKER_THREADS_H_
#define DDP_WORKER_THREADS_H_

namespace ddp {

// Budgets this process's compute threads: LibTorch's intra-op pool and
// OpenBLAS's own pool (which LibTorch does not size), so that workers
// sharing a machine don't oversubscribe its cores. 0 means every core.
// Returns the number set.
int SetComputeThreads(int threads);

}  // namespace ddp

#endif  // DDP_WORKER_THREADS_H_
