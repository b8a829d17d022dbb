// Compiled only where CMake found nccl.h and cuda_runtime_api.h: the
// declarations worker/collective/nccl_library.h makes for itself must match
// the real headers, so that a drift in NCCL's or CUDA's API is a compile
// error here rather than a crash in a worker. Nothing here runs.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <type_traits>

#include "worker/collective/nccl_library.h"

namespace ddp {
namespace {

// The type nccl_library.h uses where the headers use T: C enums become int,
// ncclUniqueId our UniqueId; handles are the same incomplete structs.
template <typename T>
struct Ours {
  using type = T;
};
template <typename T>
using OursT = typename Ours<T>::type;
template <typename T>
struct Ours<T*> {
  using type = OursT<T>*;
};
template <typename T>
struct Ours<const T> {
  using type = const OursT<T>;
};
template <>
struct Ours<ncclResult_t> {
  using type = nccl::Result;
};
template <>
struct Ours<ncclDataType_t> {
  using type = nccl::DataType;
};
template <>
struct Ours<ncclRedOp_t> {
  using type = nccl::RedOp;
};
template <>
struct Ours<ncclUniqueId> {
  using type = nccl::UniqueId;
};
template <>
struct Ours<cudaError_t> {
  using type = cuda::Error;
};
template <>
struct Ours<cudaMemcpyKind> {
  using type = cuda::MemcpyKind;
};
template <>
struct Ours<cudaPointerAttributes> {
  using type = cuda::PointerAttributes;
};
template <typename R, typename... Args>
struct Ours<R (*)(Args...)> {
  using type = OursT<R> (*)(OursT<Args>...);
};

// Each mapped type is laid out and passed as ours is.
static_assert(sizeof(ncclResult_t) == sizeof(nccl::Result));
static_assert(sizeof(ncclDataType_t) == sizeof(nccl::DataType));
static_assert(sizeof(ncclRedOp_t) == sizeof(nccl::RedOp));
static_assert(sizeof(cudaError_t) == sizeof(cuda::Error));
static_assert(sizeof(cudaMemcpyKind) == sizeof(cuda::MemcpyKind));
static_assert(sizeof(ncclUniqueId) == sizeof(nccl::UniqueId));
static_assert(sizeof(ncclUniqueId::internal) == NCCL_UNIQUE_ID_BYTES);
static_assert(alignof(ncclUniqueId) == alignof(nccl::UniqueId));
static_assert(std::is_same_v<ncclComm_t, nccl::Comm>);
static_assert(std::is_same_v<cudaStream_t, cuda::Stream>);
static_assert(sizeof(cudaMemoryType) == sizeof(cuda::MemoryType));
static_assert(sizeof(cudaPointerAttributes) == sizeof(cuda::PointerAttributes));
static_assert(offsetof(cudaPointerAttributes, type) == offsetof(cuda::PointerAttributes, type));
static_assert(offsetof(cudaPointerAttributes, device) == offsetof(cuda::PointerAttributes, device));

// The values we use.
static_assert(ncclSuccess == nccl::kSuccess);
static_assert(ncclInProgress == nccl::kInProgress);
static_assert(ncclUint8 == nccl::kUint8);
static_assert(ncclFloat16 == nccl::kFloat16);
static_assert(ncclFloat32 == nccl::kFloat32);
static_assert(ncclBfloat16 == nccl::kBfloat16);
static_assert(ncclSum == nccl::kSum);
static_assert(cudaSuccess == cuda::kSuccess);
static_assert(cudaErrorNotReady == cuda::kErrorNotReady);
static_assert(cudaMemcpyHostToDevice == cuda::kMemcpyHostToDevice);
static_assert(cudaMemcpyDeviceToHost == cuda::kMemcpyDeviceToHost);
static_assert(cudaStreamNonBlocking == cuda::kStreamNonBlocking);
static_assert(cudaHostAllocDefault == cuda::kHostAllocDefault);
static_assert(cudaMemoryTypeDevice == cuda::kMemoryTypeDevice);
static_assert(cudaMemoryTypeManaged == cuda::kMemoryTypeManaged);

// Every entry point's signature.
#define DDP_SAME_SIGNATURE(fn, ours) \
  static_assert(std::is_same_v<OursT<decltype(&::fn)>, NcclLibrary::ours>, #fn)

DDP_SAME_SIGNATURE(ncclGetVersion, GetVersionFn);
DDP_SAME_SIGNATURE(ncclGetUniqueId, GetUniqueIdFn);
DDP_SAME_SIGNATURE(ncclCommInitRank, CommInitRankFn);
DDP_SAME_SIGNATURE(ncclAllReduce, AllReduceFn);
DDP_SAME_SIGNATURE(ncclBroadcast, BroadcastFn);
DDP_SAME_SIGNATURE(ncclCommAbort, CommAbortFn);
DDP_SAME_SIGNATURE(ncclCommDestroy, CommDestroyFn);
DDP_SAME_SIGNATURE(ncclCommGetAsyncError, CommGetAsyncErrorFn);
DDP_SAME_SIGNATURE(ncclGetErrorString, GetErrorStringFn);
DDP_SAME_SIGNATURE(cudaGetDeviceCount, GetDeviceCountFn);
DDP_SAME_SIGNATURE(cudaSetDevice, SetDeviceFn);
DDP_SAME_SIGNATURE(cudaStreamCreateWithFlags, StreamCreateWithFlagsFn);
DDP_SAME_SIGNATURE(cudaStreamDestroy, StreamDestroyFn);
DDP_SAME_SIGNATURE(cudaStreamQuery, StreamQueryFn);
DDP_SAME_SIGNATURE(cudaStreamSynchronize, StreamSynchronizeFn);
DDP_SAME_SIGNATURE(cudaMemcpyAsync, MemcpyAsyncFn);
// C++ sees a template overload too: pick the C one, which must exist.
static_assert(
    std::is_same_v<
        OursT<decltype(static_cast<cudaError_t (*)(void**, size_t, unsigned)>(&::cudaHostAlloc))>,
        NcclLibrary::HostAllocFn>);
DDP_SAME_SIGNATURE(cudaFreeHost, FreeHostFn);
static_assert(
    std::is_same_v<OursT<decltype(static_cast<cudaError_t (*)(void**, size_t)>(&::cudaMalloc))>,
                   NcclLibrary::MallocFn>);
DDP_SAME_SIGNATURE(cudaFree, FreeFn);
DDP_SAME_SIGNATURE(cudaPointerGetAttributes, PointerGetAttributesFn);
DDP_SAME_SIGNATURE(cudaGetErrorName, GetErrorNameFn);
DDP_SAME_SIGNATURE(cudaGetErrorString, GetErrorStringCudaFn);

#undef DDP_SAME_SIGNATURE

}  // namespace
}  // namespace ddp
