#include "worker/collective/nccl_library.h"

#include <cstdlib>
#include <filesystem>
#include <string>

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

}  // namespace
}  // namespace ddp
