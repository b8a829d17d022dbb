// civetweb (prometheus-cpp's HTTP server) gives its threads a fixed stack
// of about 100 KiB, set with pthread_attr_setstacksize. glibc carves a
// thread's static TLS out of its stack, and the libraries the worker loads
// (OpenBLAS, glog, NCCL, LibTorch) need more than that, so pthread_create
// fails (EINVAL, no syscall) and the metrics endpoint can't start. This
// interposes the call in ddp-worker only and raises a stack below
// kMinStack to kMinStack; larger requests pass through unchanged.
#include <dlfcn.h>
#include <pthread.h>

#include <cstddef>

namespace {
constexpr size_t kMinStack = size_t{1} << 20;
using SetStackSize = int (*)(pthread_attr_t*, size_t);
}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  static const auto real =
      reinterpret_cast<SetStackSize>(::dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return real(attr, size < kMinStack ? kMinStack : size);
}
