#include "worker/collective/nccl_library.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ddp {
namespace {

constexpr char kDefaultNcclFile[] = "libnccl.so.2";
// The runtime's unversioned name first (a toolkit's, or a symlink a user
// made), then the sonames of the CUDA versions NCCL 2 is built for.
constexpr const char* kCudartFiles[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12",
                                        "libcudart.so.11.0"};

std::string LastDlError() {
  const char* e = dlerror();
  return e != nullptr ? e : "unknown error";
}

// The file the loader found, for logs ("libnccl.so.2" says little).
std::string LoadedPath(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0') {
    return map->l_name;
  }
  return fallback;
}

// Resolves `name` from `handle` into `fn`; the error names the library.
template <typename Fn>
absl::Status Resolve(void* handle, const char* name, const std::string& library,
                     const char* install, Fn* fn) {
  dlerror();
  void* symbol = dlsym(handle, name);
  if (symbol == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(library, " has no ", name, " (", LastDlError(), "); ", install));
  }
  *fn = reinterpret_cast<Fn>(symbol);
  return absl::OkStatus();
}

constexpr char kInstallNccl[] =
    "install NCCL 2 (e.g. pip's nvidia-nccl-cu12, or the CUDA toolkit's) and put it on "
    "LD_LIBRARY_PATH, or name its file in DDP_NCCL_LIBRARY";
constexpr char kInstallCudart[] =
    "install the CUDA runtime (e.g. pip's nvidia-cuda-runtime-cu12, or the CUDA toolkit's) and "
    "put it on LD_LIBRARY_PATH";

absl::Status BindNccl(void* h, const std::string& path, NcclLibrary* lib) {
  const std::string what = absl::StrCat("no usable NCCL: ", path);
  for (absl::Status s : {
           Resolve(h, "ncclGetVersion", what, kInstallNccl, &lib->ncclGetVersion),
           Resolve(h, "ncclGetUniqueId", what, kInstallNccl, &lib->ncclGetUniqueId),
           Resolve(h, "ncclCommInitRank", what, kInstallNccl, &lib->ncclCommInitRank),
           Resolve(h, "ncclAllReduce", what, kInstallNccl, &lib->ncclAllReduce),
           Resolve(h, "ncclBroadcast", what, kInstallNccl, &lib->ncclBroadcast),
           Resolve(h, "ncclCommAbort", what, kInstallNccl, &lib->ncclCommAbort),
           Resolve(h, "ncclCommDestroy", what, kInstallNccl, &lib->ncclCommDestroy),
           Resolve(h, "ncclCommGetAsyncError", what, kInstallNccl, &lib->ncclCommGetAsyncError),
           Resolve(h, "ncclGetErrorString", what, kInstallNccl, &lib->ncclGetErrorString),
       }) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status BindCudart(void* h, const std::string& path, NcclLibrary* lib) {
  const std::string what = absl::StrCat("no usable CUDA runtime: ", path);
  const char* i = kInstallCudart;
  for (absl::Status s : {
           Resolve(h, "cudaGetDeviceCount", what, i, &lib->cudaGetDeviceCount),
           Resolve(h, "cudaSetDevice", what, i, &lib->cudaSetDevice),
           Resolve(h, "cudaStreamCreateWithFlags", what, i, &lib->cudaStreamCreateWithFlags),
           Resolve(h, "cudaStreamDestroy", what, i, &lib->cudaStreamDestroy),
           Resolve(h, "cudaStreamQuery", what, i, &lib->cudaStreamQuery),
           Resolve(h, "cudaStreamSynchronize", what, i, &lib->cudaStreamSynchronize),
           Resolve(h, "cudaMemcpyAsync", what, i, &lib->cudaMemcpyAsync),
           Resolve(h, "cudaHostAlloc", what, i, &lib->cudaHostAlloc),
           Resolve(h, "cudaFreeHost", what, i, &lib->cudaFreeHost),
           Resolve(h, "cudaMalloc", what, i, &lib->cudaMalloc),
           Resolve(h, "cudaFree", what, i, &lib->cudaFree),
           Resolve(h, "cudaPointerGetAttributes", what, i, &lib->cudaPointerGetAttributes),
           Resolve(h, "cudaGetErrorName", what, i, &lib->cudaGetErrorName),
           Resolve(h, "cudaGetErrorString", what, i, &lib->cudaGetErrorString),
       }) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

std::string NcclLibrary::Version() const {
  int v = 0;
  if (ncclGetVersion(&v) != nccl::kSuccess) return "unknown";
  // Since NCCL 2.9 the code is major*10000 + minor*100 + patch; before,
  // major*1000 + minor*100 + patch.
  if (v < 10000) return absl::StrCat(v / 1000, ".", (v / 100) % 10, ".", v % 100);
  return absl::StrCat(v / 10000, ".", (v / 100) % 100, ".", v % 100);
}

absl::Status NcclLibrary::CudaError(const std::string& what, cuda::Error e) const {
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

absl::Status NcclLibrary::NcclError(const std::string& what, nccl::Result r) const {
  return absl::UnavailableError(absl::StrCat(what, ": ", ncclGetErrorString(r)));
}

std::string NcclLibraryFile() {
  const char* file = std::getenv(kNcclLibraryEnv);
  return file != nullptr && file[0] != '\0' ? file : kDefaultNcclFile;
}

absl::StatusOr<NcclLibrary> LoadNcclLibraryFrom(const std::string& nccl_file) {
  NcclLibrary lib;
  // NCCL first: a file named in DDP_NCCL_LIBRARY is the likelier mistake.
  void* nccl = dlopen(nccl_file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (nccl == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no NCCL: dlopen(", nccl_file, ") failed: ", LastDlError(), "; ", kInstallNccl));
  }
  lib.nccl_path = LoadedPath(nccl, nccl_file);
  if (absl::Status s = BindNccl(nccl, lib.nccl_path, &lib); !s.ok()) return s;

  void* cudart = nullptr;
  std::string cudart_error;
  for (const char* file : kCudartFiles) {
    cudart = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (cudart != nullptr) break;
    if (cudart_error.empty()) cudart_error = LastDlError();
  }
  if (cudart == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA runtime: dlopen(", absl::StrJoin(kCudartFiles, ", "),
                     ") failed: ", cudart_error, "; ", kInstallCudart));
  }
  lib.cudart_path = LoadedPath(cudart, kCudartFiles[0]);
  if (absl::Status s = BindCudart(cudart, lib.cudart_path, &lib); !s.ok()) return s;
  return lib;
}

absl::StatusOr<const NcclLibrary*> LoadNcclLibrary() {
  // Once per process: a function-local static is initialised thread-safely,
  // and a failure is as final as a success (restart after installing).
  static const absl::StatusOr<NcclLibrary>* const loaded =
      new absl::StatusOr<NcclLibrary>(LoadNcclLibraryFrom(NcclLibraryFile()));
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

}  // namespace ddp
