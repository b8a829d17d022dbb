#include "worker/threads.h"

#include <dlfcn.h>

#include <thread>

#include <ATen/Parallel.h>

namespace ddp {

int SetComputeThreads(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);
  // OpenBLAS is loaded by LibTorch; look it up rather than link it, so a
  // build on another BLAS still runs.
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(threads);
  }
  return threads;
}

}  // namespace ddp
