// NCCL and the CUDA runtime, bound at run time with dlopen, so that every
// build carries the NCCL communicator and a machine without a GPU or NCCL
// says so when a job asks for it (FAILED_PRECONDITION, naming what to
// install), instead of the build leaving NCCL out.
//
// The few types and entry points used are declared here from NCCL's and
// CUDA's documented C APIs; where the real headers are present at
// configure time, tests/unit/nccl_abi_check.cc static_asserts that these
// declarations match them.
#ifndef DDP_WORKER_COLLECTIVE_NCCL_LIBRARY_H_
#define DDP_WORKER_COLLECTIVE_NCCL_LIBRARY_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// The incomplete structs nccl.h and cuda_runtime_api.h name their handles
// after, so that our handle types are the very types the libraries take.
struct ncclComm;
struct CUstream_st;

namespace ddp {
namespace nccl {

// C enums cross the ABI as int.
using Result = int;  // ncclResult_t
inline constexpr Result kSuccess = 0;
inline constexpr Result kInProgress = 7;  // non-blocking communicators only

using DataType = int;  // ncclDataType_t
inline constexpr DataType kUint8 = 1;
inline constexpr DataType kFloat16 = 6;
inline constexpr DataType kFloat32 = 7;
inline constexpr DataType kBfloat16 = 9;

using RedOp = int;  // ncclRedOp_t
inline constexpr RedOp kSum = 0;

using Comm = ncclComm*;  // ncclComm_t

// ncclUniqueId: NCCL_UNIQUE_ID_BYTES opaque bytes, passed by value.
struct UniqueId {
  char internal[128];
};

}  // namespace nccl

namespace cuda {

using Error = int;  // cudaError_t
inline constexpr Error kSuccess = 0;
inline constexpr Error kErrorNotReady = 600;

using Stream = CUstream_st*;  // cudaStream_t

using MemcpyKind = int;  // cudaMemcpyKind
inline constexpr MemcpyKind kMemcpyHostToDevice = 1;
inline constexpr MemcpyKind kMemcpyDeviceToHost = 2;

inline constexpr unsigned kStreamNonBlocking = 0x01;  // cudaStreamNonBlocking
inline constexpr unsigned kHostAllocDefault = 0x00;   // cudaHostAllocDefault
using MemoryType = int;                               // cudaMemoryType
inline constexpr MemoryType kMemoryTypeDevice = 2;
inline constexpr MemoryType kMemoryTypeManaged = 3;
// cudaPointerAttributes (CUDA 11 on; the reserved words since 12.x: an
// older runtime fills less of it).
struct PointerAttributes {
  MemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
  long reserved[8];
};

}  // namespace cuda

// The entry points, resolved once per process. Every pointer is set in a
// library Load() returns. Thread-safe as the libraries are.
struct NcclLibrary {
  // NCCL.
  using GetVersionFn = nccl::Result (*)(int* version);
  using GetUniqueIdFn = nccl::Result (*)(nccl::UniqueId* id);
  using CommInitRankFn = nccl::Result (*)(nccl::Comm* comm, int nranks, nccl::UniqueId id,
                                          int rank);
  using AllReduceFn = nccl::Result (*)(const void* send, void* recv, size_t count,
                                       nccl::DataType type, nccl::RedOp op, nccl::Comm comm,
                                       cuda::Stream stream);
  using BroadcastFn = nccl::Result (*)(const void* send, void* recv, size_t count,
                                       nccl::DataType type, int root, nccl::Comm comm,
                                       cuda::Stream stream);
  using CommAbortFn = nccl::Result (*)(nccl::Comm comm);
  using CommDestroyFn = nccl::Result (*)(nccl::Comm comm);
  using CommGetAsyncErrorFn = nccl::Result (*)(nccl::Comm comm, nccl::Result* async_error);
  using GetErrorStringFn = const char* (*)(nccl::Result result);

  // The CUDA runtime.
  using GetDeviceCountFn = cuda::Error (*)(int* count);
  using SetDeviceFn = cuda::Error (*)(int device);
  using StreamCreateWithFlagsFn = cuda::Error (*)(cuda::Stream* stream, unsigned flags);
  using StreamDestroyFn = cuda::Error (*)(cuda::Stream stream);
  using StreamQueryFn = cuda::Error (*)(cuda::Stream stream);
  using StreamSynchronizeFn = cuda::Error (*)(cuda::Stream stream);
  using MemcpyAsyncFn = cuda::Error (*)(void* dst, const void* src, size_t bytes,
                                        cuda::MemcpyKind kind, cuda::Stream stream);
  using HostAllocFn = cuda::Error (*)(void** ptr, size_t bytes, unsigned flags);
  using FreeHostFn = cuda::Error (*)(void* ptr);
  using MallocFn = cuda::Error (*)(void** ptr, size_t bytes);
  using FreeFn = cuda::Error (*)(void* ptr);
  using PointerGetAttributesFn = cuda::Error (*)(cuda::PointerAttributes* attributes,
                                                 const void* ptr);
  using GetErrorNameFn = const char* (*)(cuda::Error error);
  using GetErrorStringCudaFn = const char* (*)(cuda::Error error);

  GetVersionFn ncclGetVersion = nullptr;
  GetUniqueIdFn ncclGetUniqueId = nullptr;
  CommInitRankFn ncclCommInitRank = nullptr;
  AllReduceFn ncclAllReduce = nullptr;
  BroadcastFn ncclBroadcast = nullptr;
  CommAbortFn ncclCommAbort = nullptr;
  CommDestroyFn ncclCommDestroy = nullptr;
  CommGetAsyncErrorFn ncclCommGetAsyncError = nullptr;
  GetErrorStringFn ncclGetErrorString = nullptr;

  GetDeviceCountFn cudaGetDeviceCount = nullptr;
  SetDeviceFn cudaSetDevice = nullptr;
  StreamCreateWithFlagsFn cudaStreamCreateWithFlags = nullptr;
  StreamDestroyFn cudaStreamDestroy = nullptr;
  StreamQueryFn cudaStreamQuery = nullptr;
  StreamSynchronizeFn cudaStreamSynchronize = nullptr;
  MemcpyAsyncFn cudaMemcpyAsync = nullptr;
  HostAllocFn cudaHostAlloc = nullptr;
  FreeHostFn cudaFreeHost = nullptr;
  MallocFn cudaMalloc = nullptr;
  FreeFn cudaFree = nullptr;
  PointerGetAttributesFn cudaPointerGetAttributes = nullptr;
  GetErrorNameFn cudaGetErrorName = nullptr;
  GetErrorStringCudaFn cudaGetErrorString = nullptr;

  // The files loaded, for messages and logs.
  std::string nccl_path;
  std::string cudart_path;

  // NCCL's version as "major.minor.patch".
  std::string Version() const;
  // "<what>: <cudaGetErrorName> (<cudaGetErrorString>)" as FAILED_PRECONDITION.
  absl::Status CudaError(const std::string& what, cuda::Error e) const;
  // "<what>: <ncclGetErrorString>" as UNAVAILABLE.
  absl::Status NcclError(const std::string& what, nccl::Result r) const;
};

// The environment variable that names NCCL's file when it is off the
// loader's path (e.g. DDP_NCCL_LIBRARY=/opt/nccl/lib/libnccl.so.2).
inline constexpr char kNcclLibraryEnv[] = "DDP_NCCL_LIBRARY";

// The file NCCL is loaded from: $DDP_NCCL_LIBRARY, else "libnccl.so.2".
std::string NcclLibraryFile();

// Loads NCCL (NcclLibraryFile()) and the CUDA runtime ("libcudart.so",
// then libcudart.so.13, .12, .11.0) the first time it is called, and
// returns the same answer every time after. Any thread. FAILED_PRECONDITION
// when a library or an entry point is missing, saying what to install.
absl::StatusOr<const NcclLibrary*> LoadNcclLibrary();

// As LoadNcclLibrary, from `nccl_file`, uncached (tests; the cache's one
// fill). The libraries stay loaded for the process's life.
absl::StatusOr<NcclLibrary> LoadNcclLibraryFrom(const std::string& nccl_file);

}  // namespace ddp

#endif  // DDP_WORKER_COLLECTIVE_NCCL_LIBRARY_H_
