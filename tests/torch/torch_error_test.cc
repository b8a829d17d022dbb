// LibTorch's errors as people read them: a TorchScript interpreter error's
// cause is its last line, any other error's its first.
#include "worker/elastic/torch_error.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <string>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Runs `f` from a TorchScript snippet on `x` and returns what it threw.
absl::Status RunScript(const std::string& source, const at::Tensor& x) {
  auto unit = torch::jit::compile(source);
  try {
    unit->run_method("f", x);
  } catch (const std::exception& e) {
    return TorchErrorStatus(absl::StatusCode::kInvalidArgument, "forward fails", e);
  }
  return absl::OkStatus();
}

TEST(TorchError, AssertFailsInsideTorchScript_CauseIsTheLastLine) {
  const absl::Status s = RunScript(R"(
def f(x):
    assert bool(x.sum() < 0), "the model refuses zeros"
    return x
)",
                                   torch::zeros({2}));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          "forward fails: RuntimeError: AssertionError: the model refuses zeros"));
}

TEST(TorchError, OperatorFailsInsideTorchScript_CauseIsTheOperatorsMessage) {
  const absl::Status s = RunScript(R"(
def f(x):
    return torch.mm(x, x)
)",
                                   torch::zeros({2, 3}));
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kInvalidArgument,
                  AllOf(HasSubstr("RuntimeError: mat1 and mat2 shapes cannot be multiplied"),
                        Not(HasSubstr("TorchScript interpreter")), Not(HasSubstr("Traceback")))));
}

TEST(TorchError, PlainC10Error_CauseIsTheFirstLineWithoutBacktrace) {
  try {
    TORCH_CHECK(false, "the first line\nmore detail");
  } catch (const std::exception& e) {
    EXPECT_EQ(TorchErrorCause(e), "the first line");
  }
}

TEST(TorchError, OutOfMemory_ResourceExhausted) {
  try {
    at::Tensor t = torch::empty({int64_t{1} << 48}, torch::kFloat32);
    FAIL() << "allocated 1 PiB";
  } catch (const std::exception& e) {
    EXPECT_THAT(TorchErrorStatus(absl::StatusCode::kInternal, "training failed", e),
                StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("training failed: ")));
  }
}

TEST(TorchError, HugeOrMultiLineMessage_BoundedOneLine) {
  const std::runtime_error e(std::string(5000, 'x'));
  const std::string cause = TorchErrorCause(e);
  EXPECT_LT(cause.size(), 400u);
  EXPECT_THAT(cause, HasSubstr("(5000 bytes)"));
  EXPECT_EQ(TorchErrorCause(std::runtime_error("\n\n")), "(no message)");
}

}  // namespace
}  // namespace ddp
