#include "worker/collective/nccl_communicator.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/collective/nccl_library.h"

namespace ddp {
namespace {

constexpr char kIdKey[] = "nccl/unique_id";

}  // namespace

struct NcclCommunicator::Handles {
  const NcclLibrary* lib = nullptr;
  nccl::Comm comm = nullptr;
  cuda::Stream stream = nullptr;
  // Device memory for collectives on host memory (see OnDevice), grown as
  // needed.
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
};

std::string NcclCommunicator::Version() {
  absl::StatusOr<const NcclLibrary*> lib = LoadNcclLibrary();
  return lib.ok() ? (*lib)->Version() : "none";
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(StoreClient* store,
                                                                           const Options& options) {
  absl::StatusOr<const NcclLibrary*> loaded = LoadNcclLibrary();
  if (!loaded.ok()) return loaded.status();
  const NcclLibrary& lib = **loaded;
  int devices = 0;
  if (cuda::Error e = lib.cudaGetDeviceCount(&devices); e != cuda::kSuccess) {
    return lib.CudaError(
        "no CUDA device for the nccl backend (no NVIDIA driver or GPU visible to this "
        "process): cudaGetDeviceCount",
        e);
  }
  if (devices == 0) {
    return absl::FailedPreconditionError("no CUDA device for the nccl backend on this host");
  }
  if (options.device < 0 || options.device >= devices) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda:", options.device, " does not exist: this host has ", devices, " CUDA device(s)"));
  }
  if (cuda::Error e = lib.cudaSetDevice(options.device); e != cuda::kSuccess) {
    return lib.CudaError("cudaSetDevice", e);
  }
  nccl::UniqueId id;
  if (options.rank == 0) {
    if (nccl::Result r = lib.ncclGetUniqueId(&id); r != nccl::kSuccess) {
      return lib.NcclError("ncclGetUniqueId", r);
    }
    // A world of one has no peer to tell (and may come without a store).
    if (options.world_size > 1) {
      absl::Status s = store->Set(kIdKey, std::string(id.internal, sizeof(id.internal)));
      if (!s.ok()) return s;
    }
  } else {
    absl::StatusOr<std::string> bytes = store->Get(kIdKey, options.timeout);
    if (!bytes.ok()) return bytes.status();
    // A peer's bytes, checked before they are believed.
    if (bytes->size() != sizeof(id.internal)) {
      return absl::DataLossError("the ncclUniqueId in the store has the wrong size");
    }
    std::memcpy(id.internal, bytes->data(), sizeof(id.internal));
  }
  auto handles = std::make_unique<Handles>();
  handles->lib = &lib;
  if (cuda::Error e = lib.cudaStreamCreateWithFlags(&handles->stream, cuda::kStreamNonBlocking);
      e != cuda::kSuccess) {
    return lib.CudaError("cudaStreamCreateWithFlags", e);
  }
  if (nccl::Result r = lib.ncclCommInitRank(&handles->comm, options.world_size, id, options.rank);
      r != nccl::kSuccess) {
    lib.cudaStreamDestroy(handles->stream);
    return lib.NcclError("ncclCommInitRank", r);
  }
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(std::move(handles), options));
}

NcclCommunicator::NcclCommunicator(std::unique_ptr<Handles> handles, const Options& options)
    : handles_(std::move(handles)), options_(options) {}

NcclCommunicator::~NcclCommunicator() {
  if (!aborted_) handles_->lib->ncclCommDestroy(handles_->comm);
  if (handles_->scratch != nullptr) handles_->lib->cudaFree(handles_->scratch);
  handles_->lib->cudaStreamDestroy(handles_->stream);
}

absl::Status NcclCommunicator::Wait(const char* op) {
  const NcclLibrary& lib = *handles_->lib;
  const absl::Time deadline = absl::Now() + options_.timeout;
  while (true) {
    const cuda::Error e = lib.cudaStreamQuery(handles_->stream);
    if (e == cuda::kSuccess) return absl::OkStatus();
    if (e != cuda::kErrorNotReady) return lib.CudaError(op, e);
    if (aborted_) return absl::AbortedError(absl::StrCat("nccl ", op, " aborted"));
    nccl::Result async = nccl::kSuccess;
    lib.ncclCommGetAsyncError(handles_->comm, &async);
    if (async != nccl::kSuccess) return lib.NcclError(op, async);
    if (absl::Now() > deadline) {
      Abort();
      return absl::DeadlineExceededError(absl::StrCat("nccl ", op, " on rank ", options_.rank,
                                                      " timed out after ",
                                                      absl::FormatDuration(options_.timeout)));
    }
    absl::SleepFor(absl::Microseconds(20));
  }
}

absl::Status NcclCommunicator::OnDevice(void* data, size_t bytes, const char* op,
                                        const std::function<nccl::Result(void*)>& launch) {
  if (aborted_) return absl::AbortedError("communicator aborted");
  const NcclLibrary& lib = *handles_->lib;
  Handles& h = *handles_;
  cuda::PointerAttributes attributes{};
  const bool on_device =
      lib.cudaPointerGetAttributes(&attributes, data) == cuda::kSuccess &&
      (attributes.type == cuda::kMemoryTypeDevice || attributes.type == cuda::kMemoryTypeManaged);
  void* buffer = data;
  if (!on_device && bytes > 0) {
    // Host memory (the control words, the probe, a state's bytes): NCCL
    // reads only device memory, so it goes through the scratch buffer.
    if (bytes > h.scratch_bytes) {
      if (h.scratch != nullptr) lib.cudaFree(h.scratch);
      h.scratch = nullptr;
      h.scratch_bytes = 0;
      if (cuda::Error e = lib.cudaMalloc(&h.scratch, bytes); e != cuda::kSuccess) {
        return lib.CudaError(absl::StrCat("nccl ", op, ": cudaMalloc of ", bytes, " bytes"), e);
      }
      h.scratch_bytes = bytes;
    }
    buffer = h.scratch;
    if (cuda::Error e =
            lib.cudaMemcpyAsync(buffer, data, bytes, cuda::kMemcpyHostToDevice, h.stream);
        e != cuda::kSuccess) {
      return lib.CudaError(absl::StrCat("nccl ", op, ": copying to the device"), e);
    }
  }
  if (nccl::Result r = launch(buffer); r != nccl::kSuccess) {
    return lib.NcclError(absl::StrCat("nccl ", op), r);
  }
  if (buffer != data) {
    if (cuda::Error e =
            lib.cudaMemcpyAsync(data, buffer, bytes, cuda::kMemcpyDeviceToHost, h.stream);
        e != cuda::kSuccess) {
      return lib.CudaError(absl::StrCat("nccl ", op, ": copying from the device"), e);
    }
  }
  return Wait(op);
}

absl::Status NcclCommunicator::AllReduceSum(float* data, size_t count) {
  return OnDevice(data, count * sizeof(float), "all-reduce", [&](void* buffer) {
    return handles_->lib->ncclAllReduce(buffer, buffer, count, nccl::kFloat32, nccl::kSum,
                                        handles_->comm, handles_->stream);
  });
}

absl::Status NcclCommunicator::AllReduceSumHalf(uint16_t* data, size_t count, HalfType type) {
  const nccl::DataType nccl_type = type == HalfType::kFloat16 ? nccl::kFloat16 : nccl::kBfloat16;
  return OnDevice(data, count * sizeof(uint16_t), "all-reduce", [&](void* buffer) {
    return handles_->lib->ncclAllReduce(buffer, buffer, count, nccl_type, nccl::kSum,
                                        handles_->comm, handles_->stream);
  });
}

absl::Status NcclCommunicator::Broadcast(void* data, size_t bytes, int root) {
  return OnDevice(data, bytes, "broadcast", [&](void* buffer) {
    return handles_->lib->ncclBroadcast(buffer, buffer, bytes, nccl::kUint8, root, handles_->comm,
                                        handles_->stream);
  });
}

void NcclCommunicator::Abort() {
  if (aborted_.exchange(true)) return;
  handles_->lib->ncclCommAbort(handles_->comm);
}

}  // namespace ddp
