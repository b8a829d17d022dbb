#include "worker/collective/nccl_library.h"

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "worker/collective/nccl_communicator.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Where this repository's build machines have the CUDA toolkit; CI may not.
constexpr char kToolkitNccl[] = "/usr/local/cuda/lib64/libnccl.so.2";

// Sets an environment variable for one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_.empty()) {
      unsetenv(name_);
    } else {
      setenv(name_, old_.c_str(), 1);
    }
  }

 private:
  const char* name_;
  std::string old_;
};

TEST(NcclLibrary, LoadFrom_FileFromEnvMissing_FailedPreconditionNamesFileAndFix) {
  const std::string missing = "/nonexistent/ddp-test/libnccl.so.2";
  ScopedEnv env(kNcclLibraryEnv, missing);
  ASSERT_EQ(NcclLibraryFile(), missing);
  EXPECT_THAT(LoadNcclLibraryFrom(NcclLibraryFile()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("no NCCL"), HasSubstr(missing), HasSubstr("LD_LIBRARY_PATH"),
                             HasSubstr("nvidia-nccl-cu12"))));
}

TEST(NcclLibrary, LibraryFile_NoEnv_Soname) {
  ScopedEnv env(kNcclLibraryEnv, "");
  EXPECT_EQ(NcclLibraryFile(), "libnccl.so.2");
}

TEST(NcclLibrary, LoadFrom_ToolkitFile_BindsEveryEntryPoint) {
  if (!std::filesystem::exists(kToolkitNccl)) {
    GTEST_SKIP() << kToolkitNccl << " is absent: no CUDA toolkit on this machine";
  }
  absl::StatusOr<NcclLibrary> lib = LoadNcclLibraryFrom(kToolkitNccl);
  ASSERT_THAT(lib, IsOk());
  EXPECT_EQ(lib->nccl_path, kToolkitNccl);
  EXPECT_THAT(lib->cudart_path, HasSubstr("libcudart.so"));
  EXPECT_THAT(lib->Version(), testing::MatchesRegex("2\\.[0-9]+\\.[0-9]+"));
  // The runtime answers without a GPU; its error names are real.
  EXPECT_STREQ(lib->cudaGetErrorName(cuda::kErrorNotReady), "cudaErrorNotReady");
  EXPECT_THAT(lib->NcclError("x", nccl::kInProgress), StatusIs(absl::StatusCode::kUnavailable));
}

TEST(NcclCommunicator, Create_WithoutGpuOrNccl_FailedPreconditionNotACrash) {
  absl::StatusOr<const NcclLibrary*> lib = LoadNcclLibrary();
  int devices = 0;
  if (lib.ok() && (*lib)->cudaGetDeviceCount(&devices) == cuda::kSuccess && devices > 0) {
    GTEST_SKIP() << "a CUDA device is present: this test proves the refusal without one";
  }
  NcclCommunicator::Options options;
  options.world_size = 1;
  // Fails before it would touch the store.
  EXPECT_THAT(NcclCommunicator::Create(/*store=*/nullptr, options),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr(lib.ok() ? "no CUDA device" : "no NCCL")));
  EXPECT_EQ(NcclCommunicator::Version() == "none", !lib.ok());
}

// On a GPU (tests/gpu/device_check.sh runs these; they skip elsewhere):
// NCCL at world 1 on cuda:0, on device memory and on host memory (the
// control words' path, through the communicator's device buffer).
class NcclGpu : public testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<const NcclLibrary*> lib = LoadNcclLibrary();
    int devices = 0;
    if (!lib.ok() || (*lib)->cudaGetDeviceCount(&devices) != cuda::kSuccess || devices == 0) {
      GTEST_SKIP() << "no NCCL or no CUDA device here";
    }
    lib_ = *lib;
    NcclCommunicator::Options options;
    options.world_size = 1;
    options.timeout = absl::Seconds(30);
    auto comm = NcclCommunicator::Create(/*store=*/nullptr, options);
    ASSERT_THAT(comm, IsOk());
    comm_ = std::move(*comm);
  }

  const NcclLibrary* lib_ = nullptr;
  std::unique_ptr<NcclCommunicator> comm_;
};

TEST_F(NcclGpu, WorldOne_HostMemory_AllReduceAndBroadcastKeepTheValues) {
  std::vector<float> values = {1.5f, -2.0f, 3.25f};
  ASSERT_THAT(comm_->AllReduceSum(values.data(), values.size()), IsOk());
  EXPECT_EQ(values, (std::vector<float>{1.5f, -2.0f, 3.25f}));
  std::string bytes = "state bytes";
  ASSERT_THAT(comm_->Broadcast(bytes.data(), bytes.size(), 0), IsOk());
  EXPECT_EQ(bytes, "state bytes");
}

TEST_F(NcclGpu, WorldOne_DeviceMemory_AllReduceInPlace) {
  const std::vector<float> values = {4.0f, 5.0f, -6.0f, 0.5f};
  const size_t bytes = values.size() * sizeof(float);
  void* device = nullptr;
  ASSERT_EQ(lib_->cudaMalloc(&device, bytes), cuda::kSuccess);
  ASSERT_EQ(lib_->cudaMemcpyAsync(device, values.data(), bytes, cuda::kMemcpyHostToDevice, nullptr),
            cuda::kSuccess);
  ASSERT_EQ(lib_->cudaStreamSynchronize(nullptr), cuda::kSuccess);
  EXPECT_THAT(comm_->AllReduceSum(static_cast<float*>(device), values.size()), IsOk());
  std::vector<float> back(values.size());
  ASSERT_EQ(lib_->cudaMemcpyAsync(back.data(), device, bytes, cuda::kMemcpyDeviceToHost, nullptr),
            cuda::kSuccess);
  ASSERT_EQ(lib_->cudaStreamSynchronize(nullptr), cuda::kSuccess);
  lib_->cudaFree(device);
  EXPECT_EQ(back, values);
}

TEST_F(NcclGpu, Aborted_LaterCollectivesReturnAborted) {
  comm_->Abort();
  float value = 1;
  EXPECT_THAT(comm_->AllReduceSum(&value, 1), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(comm_->Broadcast(&value, sizeof(value), 0), StatusIs(absl::StatusCode::kAborted));
}

}  // namespace
}  // namespace ddp
