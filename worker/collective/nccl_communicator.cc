#include "worker/collective/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ddp {
namespace {

constexpr char kIdKey[] = "nccl/unique_id";

absl::Status CudaError(const char* what, cudaError_t e) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

absl::Status NcclError(const char* what, ncclResult_t r) {
  return absl::UnavailableError(absl::StrCat(what, ": ", ncclGetErrorString(r)));
}

}  // namespace

struct NcclCommunicator::Handles {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

std::string NcclCommunicator::Version() {
  int v = 0;
  ncclGetVersion(&v);
  // Since NCCL 2.9 the code is major*10000 + minor*100 + patch.
  return absl::StrCat(v / 10000, ".", (v / 100) % 100, ".", v % 100);
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(StoreClient* store,
                                                                           const Options& options) {
  int devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess) {
    return CudaError("no usable CUDA device for the nccl backend", e);
  }
  if (options.device < 0 || options.device >= devices) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda:", options.device, " does not exist: this host has ", devices, " CUDA device(s)"));
  }
  if (cudaError_t e = cudaSetDevice(options.device); e != cudaSuccess) {
    return CudaError("cudaSetDevice", e);
  }
  ncclUniqueId id;
  if (options.rank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      return NcclError("ncclGetUniqueId", r);
    }
    absl::Status s = store->Set(kIdKey, std::string(id.internal, sizeof(id.internal)));
    if (!s.ok()) return s;
  } else {
    absl::StatusOr<std::string> bytes = store->Get(kIdKey, options.timeout);
    if (!bytes.ok()) return bytes.status();
    if (bytes->size() != sizeof(id.internal)) {
      return absl::DataLossError("the ncclUniqueId in the store has the wrong size");
    }
    std::memcpy(id.internal, bytes->data(), sizeof(id.internal));
  }
  auto handles = std::make_unique<Handles>();
  if (cudaError_t e = cudaStreamCreateWithFlags(&handles->stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return CudaError("cudaStreamCreate", e);
  }
  if (ncclResult_t r = ncclCommInitRank(&handles->comm, options.world_size, id, options.rank);
      r != ncclSuccess) {
    cudaStreamDestroy(handles->stream);
    return NcclError("ncclCommInitRank", r);
  }
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(std::move(handles), options));
}

NcclCommunicator::NcclCommunicator(std::unique_ptr<Handles> handles, const Options& options)
    : handles_(std::move(handles)), options_(options) {}

NcclCommunicator::~NcclCommunicator() {
  if (!aborted_) ncclCommDestroy(handles_->comm);
  cudaStreamDestroy(handles_->stream);
}

absl::Status NcclCommunicator::Wait(const char* op) {
  const absl::Time deadline = absl::Now() + options_.timeout;
  while (true) {
    const cudaError_t e = cudaStreamQuery(handles_->stream);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) return CudaError(op, e);
    if (aborted_) return absl::AbortedError(absl::StrCat("nccl ", op, " aborted"));
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(handles_->comm, &async);
    if (async != ncclSuccess) return NcclError(op, async);
    if (absl::Now() > deadline) {
      Abort();
      return absl::DeadlineExceededError(absl::StrCat("nccl ", op, " on rank ", options_.rank,
                                                      " timed out after ",
                                                      absl::FormatDuration(options_.timeout)));
    }
    absl::SleepFor(absl::Microseconds(20));
  }
}

absl::Status NcclCommunicator::AllReduceSum(float* data, size_t count) {
  if (aborted_) return absl::AbortedError("communicator aborted");
  if (ncclResult_t r =
          ncclAllReduce(data, data, count, ncclFloat, ncclSum, handles_->comm, handles_->stream);
      r != ncclSuccess) {
    return NcclError("ncclAllReduce", r);
  }
  return Wait("all-reduce");
}

absl::Status NcclCommunicator::AllReduceSumHalf(uint16_t* data, size_t count, HalfType type) {
  if (aborted_) return absl::AbortedError("communicator aborted");
  const ncclDataType_t nccl_type = type == HalfType::kFloat16 ? ncclHalf : ncclBfloat16;
  if (ncclResult_t r =
          ncclAllReduce(data, data, count, nccl_type, ncclSum, handles_->comm, handles_->stream);
      r != ncclSuccess) {
    return NcclError("ncclAllReduce", r);
  }
  return Wait("all-reduce");
}

absl::Status NcclCommunicator::Broadcast(void* data, size_t bytes, int root) {
  if (aborted_) return absl::AbortedError("communicator aborted");
  if (ncclResult_t r =
          ncclBroadcast(data, data, bytes, ncclUint8, root, handles_->comm, handles_->stream);
      r != ncclSuccess) {
    return NcclError("ncclBroadcast", r);
  }
  return Wait("broadcast");
}

void NcclCommunicator::Abort() {
  if (aborted_.exchange(true)) return;
  ncclCommAbort(handles_->comm);
}

}  // namespace ddp
