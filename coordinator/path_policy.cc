#include "coordinator/path_policy.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/job_kinds.h"
#include "common/quote.h"

namespace ddp {
namespace {

// The files the "fashion-mnist" dataset reads from its folder.
constexpr const char* kFashionMnistFiles[] = {
    "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz"};

std::string Quoted(absl::string_view path) { return absl::StrCat("\"", Bounded(path), "\""); }

absl::Status Refuse(absl::string_view field, absl::string_view path, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", Quoted(path), " ", why));
}

// Refuses what no lookup should even try: relative paths, "..", NUL.
absl::Status CheckSpelling(absl::string_view field, absl::string_view path) {
  if (path.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": the path contains a NUL byte"));
  }
  if (!absl::StartsWith(path, "/")) return Refuse(field, path, "is not an absolute path");
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "..") return Refuse(field, path, "has a \"..\" component");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RealPath(absl::string_view field, const std::string& path) {
  std::unique_ptr<char, decltype(&::free)> real(::realpath(path.c_str(), nullptr), &::free);
  if (real) return std::string(real.get());
  const int error = errno;
  switch (error) {
    case ENOENT:
    case ENOTDIR:
      return Refuse(field, path, "does not exist");
    case EACCES:
      return Refuse(field, path, "can't be reached (permission denied on a folder in it)");
    default:
      return Refuse(field, path, absl::StrCat("can't be resolved: ", ::strerror(error)));
  }
}

bool IsUnder(absl::string_view real, absl::string_view root) {
  if (root == "/") return true;
  return absl::StartsWith(real, root) && (real.size() == root.size() || real[root.size()] == '/');
}

// Whether `real` (a resolved path) lies under one of `roots`, each resolved
// now: a root that is itself a symlink counts where it leads.
bool UnderARoot(absl::string_view real, const std::vector<std::string>& roots) {
  for (const std::string& root : roots) {
    std::unique_ptr<char, decltype(&::free)> resolved(::realpath(root.c_str(), nullptr), &::free);
    if (resolved && IsUnder(real, resolved.get())) return true;
  }
  return false;
}

absl::Status NotUnderRoots(absl::string_view field, absl::string_view path, absl::string_view real,
                           absl::string_view flag, const std::vector<std::string>& roots) {
  return Refuse(field, path,
                absl::StrCat(real == path ? "" : absl::StrCat("(really ", Quoted(real), ") "),
                             "is not under a folder the coordinator allows (", flag, ": ",
                             roots.empty() ? "none" : absl::StrJoin(roots, ", "), ")"));
}

std::string KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

absl::StatusOr<struct stat> Stat(absl::string_view field, const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return Refuse(field, path, absl::StrCat("can't be examined: ", ::strerror(errno)));
  }
  return st;
}

// An input's real location (every symlink resolved) and what it is, once
// its spelling is fine and it lies under a data root.
struct Examined {
  std::string real;
  struct stat st;
};

absl::StatusOr<Examined> ExamineInput(absl::string_view field, const std::string& path,
                                      const PathRoots& roots) {
  if (absl::Status s = CheckSpelling(field, path); !s.ok()) return s;
  absl::StatusOr<std::string> real = RealPath(field, path);
  if (!real.ok()) return real.status();
  if (!UnderARoot(*real, roots.data)) {
    return NotUnderRoots(field, path, *real, "--data_root", roots.data);
  }
  absl::StatusOr<struct stat> st = Stat(field, *real);
  if (!st.ok()) return st.status();
  return Examined{std::move(*real), *st};
}

// A model or data file: under a data root, a regular file, not too big.
absl::Status CheckInputFile(absl::string_view field, const std::string& path,
                            const PathRoots& roots) {
  absl::StatusOr<Examined> input = ExamineInput(field, path, roots);
  if (!input.ok()) return input.status();
  const struct stat* st = &input->st;
  if (!S_ISREG(st->st_mode)) {
    return Refuse(field, path, absl::StrCat("is ", KindOf(st->st_mode), ", not a regular file"));
  }
  if (static_cast<uint64_t>(st->st_size) > roots.max_input_bytes) {
    return Refuse(field, path,
                  absl::StrCat("is ", st->st_size, " bytes; the largest input accepted is ",
                               roots.max_input_bytes, " bytes (--max_input_size)"));
  }
  return absl::OkStatus();
}

// Fashion-MNIST's folder: under a data root, and its files each checked
// (one of them could be a symlink leading out).
absl::Status CheckInputFolder(absl::string_view field, const std::string& path,
                              const PathRoots& roots) {
  absl::StatusOr<Examined> folder = ExamineInput(field, path, roots);
  if (!folder.ok()) return folder.status();
  if (!S_ISDIR(folder->st.st_mode)) return Refuse(field, path, "is not a folder");
  for (const char* file : kFashionMnistFiles) {
    if (absl::Status s = CheckInputFile(field, absl::StrCat(folder->real, "/", file), roots);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// An image folder or a shards folder: under a data root, and a folder. Its
// files are read under the worker's confinement, which lets a job read nothing outside it
// (a link leading out is refused when read, naming the file).
absl::Status CheckDataFolder(absl::string_view field, const std::string& path,
                             const PathRoots& roots) {
  absl::StatusOr<Examined> folder = ExamineInput(field, path, roots);
  if (!folder.ok()) return folder.status();
  if (!S_ISDIR(folder->st.st_mode)) return Refuse(field, path, "is not a folder");
  return absl::OkStatus();
}

// The folder an absolute path (spelled as CheckSpelling allows) names a
// file in.
std::string FolderOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Where rank 0 writes the trained model: a new file (or, with
// overwrite_output, a regular file) in an existing folder under an output
// root.
absl::Status CheckOutputFile(absl::string_view field, const std::string& path, bool overwrite,
                             const PathRoots& roots) {
  if (absl::Status s = CheckSpelling(field, path); !s.ok()) return s;
  const std::string folder = FolderOf(path);
  const std::string name = path.substr(path.rfind('/') + 1);
  if (name.empty() || name == ".") return Refuse(field, path, "names a folder; name a file in it");
  absl::StatusOr<std::string> real_folder = RealPath(field, folder);
  if (!real_folder.ok()) {
    return Refuse(field, path, absl::StrCat("is in ", Quoted(folder), ", which does not exist"));
  }
  absl::StatusOr<struct stat> folder_st = Stat(field, *real_folder);
  if (!folder_st.ok()) return folder_st.status();
  if (!S_ISDIR(folder_st->st_mode)) {
    return Refuse(field, path, absl::StrCat("is in ", Quoted(folder), ", which is not a folder"));
  }
  const std::string real = absl::StrCat(*real_folder == "/" ? "" : *real_folder, "/", name);
  if (!UnderARoot(real, roots.output)) {
    return NotUnderRoots(field, path, real, "--output_root", roots.output);
  }
  struct stat st;
  if (::lstat(real.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return Refuse(field, path, absl::StrCat("can't be examined: ", ::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) return Refuse(field, path, "is a folder; name a file in it");
  if (!S_ISREG(st.st_mode)) {
    return Refuse(field, path, absl::StrCat("is ", KindOf(st.st_mode), ", not a regular file"));
  }
  if (!overwrite) {
    return Refuse(field, path, "already exists; set overwrite_output to replace it");
  }
  return absl::OkStatus();
}

// Where folder `path` leads, every link resolved; one that does not exist
// yet is its nearest existing ancestor resolved with the rest appended
// (`exists` says which).
absl::StatusOr<std::string> ResolveFolder(absl::string_view field, const std::string& path,
                                          bool* exists) {
  std::string existing = path;
  std::string rest;
  std::unique_ptr<char, decltype(&::free)> real(nullptr, &::free);
  // Bounded by the path's depth: each turn drops one component.
  while (true) {
    real.reset(::realpath(existing.c_str(), nullptr));
    if (real || (errno != ENOENT) || existing == "/") break;
    const size_t slash = existing.rfind('/');
    rest = absl::StrCat(existing.substr(slash), rest);
    existing = slash == 0 ? "/" : existing.substr(0, slash);
  }
  if (!real) {
    return Refuse(field, path, absl::StrCat("can't be resolved: ", ::strerror(errno)));
  }
  *exists = rest.empty();
  const std::string resolved = absl::StrCat(std::string(real.get()) == "/" ? "" : real.get(), rest);
  return resolved.empty() ? "/" : resolved;
}

// The checkpoint folder: under an output root, as the output is (it is
// written and read back); it may not exist yet (the workers create it), so
// its nearest existing ancestor is resolved and the rest appended.
absl::Status CheckCheckpointFolder(absl::string_view field, const std::string& path,
                                   const PathRoots& roots) {
  if (absl::Status s = CheckSpelling(field, path); !s.ok()) return s;
  bool exists = false;
  absl::StatusOr<std::string> real = ResolveFolder(field, path, &exists);
  if (!real.ok()) return real.status();
  const std::string& resolved = *real;
  if (!UnderARoot(resolved, roots.output)) {
    return NotUnderRoots(field, path, resolved, "--output_root", roots.output);
  }
  if (exists) {
    absl::StatusOr<struct stat> st = Stat(field, resolved);
    if (!st.ok()) return st.status();
    if (!S_ISDIR(st->st_mode)) {
      return Refuse(field, path, absl::StrCat("is ", KindOf(st->st_mode), ", not a folder"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseRootList(absl::string_view flag,
                                                       absl::string_view list) {
  std::vector<std::string> roots;
  for (absl::string_view root : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    root = absl::StripAsciiWhitespace(root);
    if (absl::Status s = CheckSpelling(flag, root); !s.ok()) return s;
    roots.emplace_back(root);
  }
  if (roots.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": name at least one folder"));
  }
  return roots;
}

absl::Status CheckPinnedInputs(const v1::JobSpec& spec, const PathRoots& roots) {
  for (const v1::InputFile& pin : spec.input_files()) {
    if (!UnderARoot(pin.real_path(), roots.data)) {
      return NotUnderRoots("input file", pin.path(), pin.real_path(), "--data_root", roots.data);
    }
  }
  return absl::OkStatus();
}

namespace {

// A dataset's own path: a folder of idx files, a tensors file, image
// folders, or none.
absl::Status CheckDatasetPath(const v1::DatasetSpec& data, const PathRoots& roots) {
  switch (DatasetKindOf(data)) {
    case v1::DATASET_KIND_FASHION_MNIST:
      return CheckInputFolder("dataset.path", data.path(), roots);
    case v1::DATASET_KIND_TENSORS:
      return CheckInputFile("dataset.path", data.path(), roots);
    case v1::DATASET_KIND_IMAGE_FOLDER:
    case v1::DATASET_KIND_SHARDS:
      if (absl::Status s = CheckDataFolder("dataset.path", data.path(), roots); !s.ok()) return s;
      if (!data.test_path().empty()) {
        if (absl::Status s = CheckDataFolder("dataset.test_path", data.test_path(), roots);
            !s.ok()) {
          return s;
        }
      }
      if (!data.manifest().empty()) {
        if (absl::Status s = CheckInputFile("dataset.manifest", data.manifest(), roots); !s.ok()) {
          return s;
        }
      }
      return data.test_manifest().empty()
                 ? absl::OkStatus()
                 : CheckInputFile("dataset.test_manifest", data.test_manifest(), roots);
    case v1::DATASET_KIND_SYNTHETIC:
    case v1::DATASET_KIND_PROGRAM:
    case v1::DATASET_KIND_UNKNOWN:
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckJobPaths(const v1::JobSpec& spec, const PathRoots& roots) {
  if (ModelKindOf(spec.model()) == v1::MODEL_KIND_TORCHSCRIPT) {
    if (absl::Status s = CheckInputFile("model.path", spec.model().path(), roots); !s.ok()) {
      return s;
    }
  }
  const v1::DatasetSpec& data = spec.dataset();
  if (absl::Status s = CheckDatasetPath(data, roots); !s.ok()) return s;
  const bool folders = DatasetKindOf(data) == v1::DATASET_KIND_IMAGE_FOLDER ||
                       DatasetKindOf(data) == v1::DATASET_KIND_SHARDS;
  if (!data.test_path().empty() && !folders) {
    if (absl::Status s = CheckInputFile("dataset.test_path", data.test_path(), roots); !s.ok()) {
      return s;
    }
  }
  if (!spec.output_path().empty()) {
    if (absl::Status s =
            CheckOutputFile("output_path", spec.output_path(), spec.overwrite_output(), roots);
        !s.ok()) {
      return s;
    }
  }
  if (!spec.checkpoint().dir().empty()) {
    if (absl::Status s = CheckCheckpointFolder("checkpoint.dir", spec.checkpoint().dir(), roots);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status PinWriteFolders(v1::JobSpec* spec, const PathRoots& roots) {
  spec->clear_write_folders();
  auto pin = [&](absl::string_view field, const std::string& folder) -> absl::Status {
    bool exists = false;
    absl::StatusOr<std::string> real = ResolveFolder(field, folder, &exists);
    if (!real.ok()) return real.status();
    // Checked by CheckJobPaths already; again, as it may have moved since.
    if (!UnderARoot(*real, roots.output)) {
      return NotUnderRoots(field, folder, *real, "--output_root", roots.output);
    }
    v1::WriteFolder* pinned = spec->add_write_folders();
    pinned->set_field(std::string(field));
    pinned->set_path(folder);
    pinned->set_real_path(*real);
    return absl::OkStatus();
  };
  if (!spec->checkpoint().dir().empty()) {
    if (absl::Status s = pin("checkpoint.dir", spec->checkpoint().dir()); !s.ok()) return s;
  }
  if (!spec->output_path().empty()) {
    if (absl::Status s = pin("output_path", FolderOf(spec->output_path())); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace ddp
