#include "coordinator/path_policy.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using testing::AllOf;
using testing::HasSubstr;

// A small filesystem in a temporary folder:
//   data/  (the data root)   model.pt, big.pt (too big), fifo, subdir/,
//          inside -> model.pt, escape -> ../secret/file, fmnist/ (4 files),
//          fmnist-bad/ (3 files and one symlink out of the root)
//   out/   (the output root) existing.pt, folder/, link -> ../secret/file,
//          outlink -> ../secret
//   secret/file
class PathPolicyTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/ddp-path-policy-XXXXXX";
    base_ = new std::string(::mkdtemp(tmpl));
    for (const char* dir : {"/data", "/data/subdir", "/data/fmnist", "/data/fmnist-bad", "/out",
                            "/out/folder", "/secret"}) {
      ::mkdir((*base_ + dir).c_str(), 0755);
    }
    Write("/data/model.pt", 10);
    Write("/data/big.pt", 2000);
    Write("/secret/file", 10);
    Write("/out/existing.pt", 10);
    ::mkfifo((*base_ + "/data/fifo").c_str(), 0644);
    Link("model.pt", "/data/inside");
    Link("../secret/file", "/data/escape");
    Link("../secret/file", "/out/link");
    Link("../secret", "/out/outlink");
    for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                          "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
      Write(std::string("/data/fmnist/") + f, 10);
    }
    for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                          "t10k-images-idx3-ubyte.gz"}) {
      Write(std::string("/data/fmnist-bad/") + f, 10);
    }
    Link("../../secret/file", "/data/fmnist-bad/t10k-labels-idx1-ubyte.gz");
  }
  static void TearDownTestSuite() {
    std::system(("rm -rf " + *base_).c_str());
    delete base_;
  }
  static void Write(const std::string& path, size_t bytes) {
    std::ofstream(*base_ + path) << std::string(bytes, 'x');
  }
  static void Link(const std::string& target, const std::string& path) {
    ASSERT_EQ(::symlink(target.c_str(), (*base_ + path).c_str()), 0);
  }
  static std::string At(const std::string& path) { return *base_ + path; }

  static PathRoots Roots() {
    PathRoots roots;
    roots.data = {At("/data"), "/dev"};
    roots.output = {At("/out")};
    roots.max_input_bytes = 1000;
    return roots;
  }

  static std::string* base_;
};
std::string* PathPolicyTest::base_ = nullptr;

struct Case {
  std::string name;
  std::function<void(v1::JobSpec*)> set;
  absl::StatusCode code;
  std::vector<std::string> words;  // in the message
};

v1::JobSpec Spec() {
  v1::JobSpec spec;
  spec.mutable_model()->set_kind("mlp");
  spec.mutable_dataset()->set_kind("synthetic");
  return spec;
}

auto Model(std::string path) {
  return [path](v1::JobSpec* s) {
    s->mutable_model()->set_kind("torchscript");
    s->mutable_model()->set_path(path);
  };
}
auto Tensors(std::string path, std::string test_path = "") {
  return [path, test_path](v1::JobSpec* s) {
    s->mutable_dataset()->set_kind("tensors");
    s->mutable_dataset()->set_path(path);
    s->mutable_dataset()->set_test_path(test_path);
  };
}
auto Fashion(std::string path) {
  return [path](v1::JobSpec* s) {
    s->mutable_dataset()->set_kind("fashion-mnist");
    s->mutable_dataset()->set_path(path);
  };
}
auto Output(std::string path, bool overwrite = false) {
  return [path, overwrite](v1::JobSpec* s) {
    s->set_output_path(path);
    s->set_overwrite_output(overwrite);
  };
}
auto Checkpoints(std::string dir) {
  return [dir](v1::JobSpec* s) { s->mutable_checkpoint()->set_dir(dir); };
}

TEST_F(PathPolicyTest, CheckJobPaths_Table) {
  constexpr auto kOk = absl::StatusCode::kOk;
  constexpr auto kBad = absl::StatusCode::kInvalidArgument;
  const std::vector<Case> cases = {
      {"built-in model, synthetic data: no paths", [](v1::JobSpec*) {}, kOk, {}},
      {"model under the root", Model(At("/data/model.pt")), kOk, {}},
      {"symlink within the root", Model(At("/data/inside")), kOk, {}},
      {"relative model path", Model("data/model.pt"), kBad, {"model.path", "absolute"}},
      {"dot-dot", Model(At("/data/../data/model.pt")), kBad, {"model.path", "\"..\""}},
      {"missing", Model(At("/data/nope.pt")), kBad, {"model.path", "does not exist"}},
      {"outside the roots",
       Model(At("/secret/file")),
       kBad,
       {"model.path", "not under", "--data_root", At("/data")}},
      {"symlink leading out",
       Model(At("/data/escape")),
       kBad,
       {"model.path", "really", At("/secret/file"), "not under"}},
      {"FIFO", Model(At("/data/fifo")), kBad, {"model.path", "a FIFO", "not a regular file"}},
      {"folder", Model(At("/data/subdir")), kBad, {"model.path", "a folder"}},
      {"device", Model("/dev/zero"), kBad, {"model.path", "a character device"}},
      {"too big",
       Model(At("/data/big.pt")),
       kBad,
       {"model.path", "2000 bytes", "1000", "--max_input_size"}},
      {"NUL byte",
       Model(At("/data/model.pt") + std::string(1, '\0') + "x"),
       kBad,
       {"model.path", "NUL"}},
      {"tensors, both files", Tensors(At("/data/model.pt"), At("/data/inside")), kOk, {}},
      {"tensors, test file a FIFO",
       Tensors(At("/data/model.pt"), At("/data/fifo")),
       kBad,
       {"dataset.test_path", "a FIFO"}},
      {"tensors, data /dev/zero",
       Tensors("/dev/zero"),
       kBad,
       {"dataset.path", "a character device"}},
      {"fashion-mnist folder", Fashion(At("/data/fmnist")), kOk, {}},
      {"fashion-mnist file leading out",
       Fashion(At("/data/fmnist-bad")),
       kBad,
       {"dataset.path", "t10k-labels", "not under"}},
      {"fashion-mnist path is a file",
       Fashion(At("/data/model.pt")),
       kBad,
       {"dataset.path", "not a folder"}},
      {"new output file", Output(At("/out/new.pt")), kOk, {}},
      {"existing output",
       Output(At("/out/existing.pt")),
       kBad,
       {"output_path", "already exists", "overwrite_output"}},
      {"existing output, overwrite", Output(At("/out/existing.pt"), true), kOk, {}},
      {"output is a folder", Output(At("/out/folder"), true), kBad, {"output_path", "is a folder"}},
      {"output ends in a slash",
       Output(At("/out/folder/")),
       kBad,
       {"output_path", "names a folder"}},
      {"output folder missing",
       Output(At("/out/nope/x.pt")),
       kBad,
       {"output_path", "does not exist"}},
      {"output folder is a file",
       Output(At("/out/existing.pt/x.pt")),
       kBad,
       {"output_path", "not a folder"}},
      {"output outside the roots",
       Output(At("/secret/x.pt")),
       kBad,
       {"output_path", "--output_root", At("/out")}},
      {"output through a symlinked folder leading out",
       Output(At("/out/outlink/x.pt")),
       kBad,
       {"output_path", "really", "not under"}},
      {"output is a symlink",
       Output(At("/out/link"), true),
       kBad,
       {"output_path", "a symbolic link"}},
      {"output dot-dot", Output(At("/out/../out/x.pt")), kBad, {"output_path", "\"..\""}},
      {"output relative", Output("out/x.pt"), kBad, {"output_path", "absolute"}},
      {"output into a data root",
       Output(At("/data/new.pt")),
       kBad,
       {"output_path", "--output_root"}},
      {"checkpoints in an output folder", Checkpoints(At("/out/folder")), kOk, {}},
      {"checkpoints in a folder yet to be made", Checkpoints(At("/out/new/ckpt")), kOk, {}},
      {"checkpoints in /etc",
       Checkpoints("/etc/ddp"),
       kBad,
       {"checkpoint.dir", "--output_root", At("/out")}},
      {"checkpoints through a symlinked folder leading out",
       Checkpoints(At("/out/outlink/ckpt")),
       kBad,
       {"checkpoint.dir", "really", At("/secret/ckpt"), "not under"}},
      {"checkpoints in a file", Checkpoints(At("/out/existing.pt")), kBad, {"not a folder"}},
      {"checkpoints relative", Checkpoints("out/ckpt"), kBad, {"checkpoint.dir", "absolute"}},
      {"checkpoints dot-dot",
       Checkpoints(At("/out/../secret")),
       kBad,
       {"checkpoint.dir", "\"..\""}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::JobSpec spec = Spec();
    c.set(&spec);
    const absl::Status s = CheckJobPaths(spec, Roots());
    EXPECT_EQ(s.code(), c.code) << s;
    for (const std::string& word : c.words) EXPECT_THAT(std::string(s.message()), HasSubstr(word));
  }
}

TEST_F(PathPolicyTest, CheckJobPaths_NoRoots_RefusesEveryPath) {
  PathRoots none;
  v1::JobSpec spec = Spec();
  Model(At("/data/model.pt"))(&spec);
  EXPECT_THAT(CheckJobPaths(spec, none),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("none")));
}

TEST(ParseRootList, CommaSeparated_TrimmedAndChecked) {
  auto roots = ParseRootList("--data_root", " /a, /b/c ,");
  ASSERT_THAT(roots, IsOk());
  EXPECT_EQ(*roots, (std::vector<std::string>{"/a", "/b/c"}));
  EXPECT_THAT(ParseRootList("--data_root", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--data_root")));
  EXPECT_THAT(ParseRootList("--output_root", "/a,rel"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("--output_root"), HasSubstr("absolute"))));
  EXPECT_THAT(ParseRootList("--output_root", "/a/../b"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("..")));
}

}  // namespace
}  // namespace ddp
