#include "worker/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <random>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "worker/input_files.h"

namespace ddp {
namespace {

constexpr absl::string_view kPrefix = "ckpt-";
constexpr absl::string_view kSuffix = ".ddpstate";
constexpr absl::string_view kTempMarker = ".tmp.";
constexpr size_t kStepDigits = 20;
constexpr size_t kTempRandom = 6;  // mkstemp's XXXXXX

std::string OsError(int e) { return std::error_code(e, std::generic_category()).message(); }

std::string JoinPath(const std::string& dir, absl::string_view name) {
  return absl::StrCat(dir, absl::EndsWith(dir, "/") ? "" : "/", name);
}

bool ConsumeDigits(absl::string_view* s) {
  if (s->size() < kStepDigits) return false;
  for (size_t i = 0; i < kStepDigits; ++i) {
    if (!absl::ascii_isdigit((*s)[i])) return false;
  }
  s->remove_prefix(kStepDigits);
  return true;
}

// "ckpt-<20 digits>.ddpstate"
bool IsCheckpointName(absl::string_view name) {
  return absl::ConsumePrefix(&name, kPrefix) && ConsumeDigits(&name) && name == kSuffix;
}

// ".ckpt-<20 digits>.ddpstate.tmp.XXXXXX"
bool IsTempName(absl::string_view name) {
  return absl::ConsumePrefix(&name, ".") && absl::ConsumePrefix(&name, kPrefix) &&
         ConsumeDigits(&name) && absl::ConsumePrefix(&name, kSuffix) &&
         absl::ConsumePrefix(&name, kTempMarker) && name.size() == kTempRandom;
}

// The names in `dir`; errno's reason when it can't be read.
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    const int e = errno;
    return absl::Status(
        e == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kFailedPrecondition,
        absl::StrCat("can't read checkpoint folder ", dir, ": ", OsError(e)));
  }
  std::vector<std::string> names;
  while (dirent* entry = readdir(d)) names.emplace_back(entry->d_name);
  closedir(d);
  return names;
}

absl::Status WriteAll(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(OsError(errno));
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Creates ".<name>.tmp.XXXXXX" in `dir`, 0640 whatever the umask: the
// group may read checkpoints (a job's other machines), others never.
// Returns the descriptor, or -1 with errno set.
int CreateTemp(const std::string& dir, absl::string_view name, std::string* path) {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::random_device random;
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string suffix(kTempRandom, ' ');
    for (char& c : suffix) c = kChars[random() % (sizeof(kChars) - 1)];
    *path = JoinPath(dir, absl::StrCat(".", name, kTempMarker, suffix));
    const int fd = open(path->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640);
    if (fd >= 0 && fchmod(fd, 0640) != 0) {
      const int e = errno;
      close(fd);
      unlink(path->c_str());
      errno = e;
      return -1;
    }
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;
}

// Makes a rename in `dir` durable.
int FsyncDir(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  const int e = fsync(fd) == 0 ? 0 : errno;
  close(fd);
  return e;
}

// Deletes checkpoints older than the newest `keep` (never `just_written`)
// and temporary files of crashed writes. Failures are logged, not fatal:
// the checkpoint just written is good either way.
void Prune(const std::string& dir, uint32_t keep, absl::string_view just_written) {
  absl::StatusOr<std::vector<std::string>> names = ListDir(dir);
  if (!names.ok()) {
    DDP_LOG(Warning) << "not pruning old checkpoints: " << names.status().message();
    return;
  }
  std::vector<std::string> checkpoints;
  for (const std::string& name : *names) {
    if (IsCheckpointName(name)) checkpoints.push_back(name);
    if (IsTempName(name) && unlink(JoinPath(dir, name).c_str()) != 0 && errno != ENOENT) {
      DDP_LOG(Warning) << "can't remove the leftover temporary file " << JoinPath(dir, name) << ": "
                       << OsError(errno);
    }
  }
  // Zero-padded steps: the names sort as the steps do.
  std::sort(checkpoints.begin(), checkpoints.end(), std::greater<>());
  for (size_t i = keep; i < checkpoints.size(); ++i) {
    if (checkpoints[i] == just_written) continue;
    const std::string path = JoinPath(dir, checkpoints[i]);
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      DDP_LOG(Warning) << "can't remove the old checkpoint " << path << ": " << OsError(errno);
    }
  }
}

// Reads a checkpoint as the untrusted file it is (ReadRegularFile): never
// through a symbolic link, never blocking on a FIFO or device, a regular
// file of at most `max_bytes`, checked before anything is allocated.
absl::StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_bytes) {
  RegularFileRead read = ReadRegularFile(path, max_bytes);
  using R = RegularFileRead::Refusal;
  switch (read.refusal) {
    case R::kNone:
      return std::move(read.bytes);
    case R::kLink:
      return absl::FailedPreconditionError(
          "is a symbolic link (checkpoints are read only as regular files)");
    case R::kCantOpen:
      return absl::FailedPreconditionError(absl::StrCat("can't open: ", OsError(read.error)));
    case R::kNotRegular:
      return absl::FailedPreconditionError("is not a regular file");
    case R::kTooLarge:
    case R::kWrongSize:
      return absl::FailedPreconditionError(absl::StrCat(
          "is ", read.size, " bytes, more than this job's state can be (", max_bytes, ")"));
    case R::kCantRead:
      return absl::InternalError(absl::StrCat("can't read: ", OsError(read.error)));
    case R::kChanged:
      return absl::FailedPreconditionError("changed size while being read");
  }
  return absl::InternalError("unreachable");
}

}  // namespace

std::string CheckpointFileName(uint64_t step) {
  return absl::StrFormat("%s%020d%s", kPrefix, step, kSuffix);
}

absl::StatusOr<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Create(Options options) {
  if (options.dir.empty()) {
    return absl::InvalidArgumentError("checkpoint folder: the path is empty");
  }
  if (options.keep == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint folder ", options.dir, ": keep must be at least 1"));
  }
  std::error_code ec;
  // A folder made here is 0750 whatever the umask; one that exists keeps
  // its owner's choice.
  if (std::filesystem::create_directories(options.dir, ec) && !ec) {
    std::filesystem::permissions(options.dir, std::filesystem::perms(0750),
                                 std::filesystem::perm_options::replace, ec);
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("can't create checkpoint folder ", options.dir, ": ", ec.message()));
  }
  std::string probe = JoinPath(options.dir, ".ddp-probe-XXXXXX");
  const int fd = mkstemp(probe.data());
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint folder ", options.dir, " is not writable: ", OsError(errno)));
  }
  absl::Status written = WriteAll(fd, "probe");
  close(fd);
  unlink(probe.c_str());
  if (!written.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint folder ", options.dir, " is not writable: ", written.message()));
  }
  return std::unique_ptr<CheckpointWriter>(new CheckpointWriter(std::move(options)));
}

CheckpointWriter::CheckpointWriter(Options options) : options_(std::move(options)) {
  thread_ = std::thread([this] { Loop(); });
}

CheckpointWriter::~CheckpointWriter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

bool CheckpointWriter::Submit(uint64_t generation, uint64_t step, uint64_t epoch,
                              std::string bytes) {
  absl::MutexLock lock(&mu_);
  if (busy_ || stopping_) {
    ++refused_;
    return false;
  }
  busy_ = true;
  pending_ = Job{generation, step, epoch, std::move(bytes)};
  return true;
}

bool CheckpointWriter::SubmitWhenIdle(uint64_t generation, uint64_t step, uint64_t epoch,
                                      std::string bytes) {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](CheckpointWriter* w)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) { return !w->busy_ || w->stopping_; },
      this));
  if (stopping_) return false;
  busy_ = true;
  pending_ = Job{generation, step, epoch, std::move(bytes)};
  return true;
}

uint64_t CheckpointWriter::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

void CheckpointWriter::Loop() {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](CheckpointWriter* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) {
            return w->pending_.has_value() || w->stopping_;
          },
          this));
      // A submitted write is finished even when stopping.
      if (!pending_.has_value()) return;
      job = std::move(*pending_);
      pending_.reset();
    }
    const v1::CheckpointResult result = Write(job);
    job.bytes = std::string();  // free the state before on_done, which may be slow
    {
      // Free before on_done, so that a caller told of this write can submit
      // the next at once (it starts when on_done returns).
      absl::MutexLock lock(&mu_);
      busy_ = false;
    }
    if (!result.error().empty()) DDP_LOG(Warning) << result.error();
    if (options_.on_done) options_.on_done(result);
  }
}

v1::CheckpointResult CheckpointWriter::Write(const Job& job) {
  const absl::Time start = options_.clock->Now();
  const std::string name = CheckpointFileName(job.step);
  const std::string path = JoinPath(options_.dir, name);
  v1::CheckpointResult result;
  result.set_generation(job.generation);
  result.set_step(job.step);
  result.set_epoch(job.epoch);
  result.set_path(path);
  auto fail = [&](absl::string_view what, absl::string_view why) {
    result.set_error(absl::StrCat(what, " checkpoint ", path, ": ", why));
    result.set_seconds(absl::ToDoubleSeconds(options_.clock->Now() - start));
    return result;
  };

  std::string temp;
  const int fd = CreateTemp(options_.dir, name, &temp);
  if (fd < 0) return fail("can't create a temporary file for", OsError(errno));
  // Whatever goes wrong from here, no partial file stays behind.
  auto abandon = [&](absl::string_view what, absl::string_view why) {
    close(fd);
    unlink(temp.c_str());
    return fail(what, why);
  };
  if (absl::Status s = WriteAll(fd, job.bytes); !s.ok()) return abandon("can't write", s.message());
  if (fsync(fd) != 0) return abandon("can't flush", OsError(errno));
  if (close(fd) != 0) {
    const int e = errno;
    unlink(temp.c_str());
    return fail("can't close", OsError(e));
  }
  if (rename(temp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    unlink(temp.c_str());
    return fail("can't rename the temporary file into", OsError(e));
  }
  if (const int e = FsyncDir(options_.dir); e != 0) {
    // The file is whole, but a power cut could still lose the rename.
    return fail("can't flush the folder of", OsError(e));
  }
  Prune(options_.dir, options_.keep, name);
  result.set_bytes(job.bytes.size());
  result.set_seconds(absl::ToDoubleSeconds(options_.clock->Now() - start));
  return result;
}

absl::StatusOr<LoadedCheckpoint> LoadNewestCheckpoint(const std::string& dir,
                                                      const StateIdentity& expected,
                                                      uint64_t max_bytes) {
  absl::StatusOr<std::vector<std::string>> names = ListDir(dir);
  if (!names.ok()) {
    return absl::NotFoundError(
        absl::StrCat("no checkpoint to resume from: ", names.status().message()));
  }
  std::vector<std::string> checkpoints;
  for (const std::string& name : *names) {
    if (IsCheckpointName(name)) checkpoints.push_back(name);
  }
  if (checkpoints.empty()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint to resume from: folder ", dir,
                                            " holds no ", kPrefix, "*", kSuffix, " file"));
  }
  std::sort(checkpoints.begin(), checkpoints.end(), std::greater<>());
  LoadedCheckpoint loaded;
  for (const std::string& name : checkpoints) {
    const std::string path = JoinPath(dir, name);
    absl::StatusOr<std::string> bytes = ReadFile(path, max_bytes);
    if (!bytes.ok()) {
      loaded.skipped.push_back(absl::StrCat(path, ": ", bytes.status().message()));
      continue;
    }
    absl::StatusOr<v1::TrainingStateHeader> header = ReadTrainingStateHeader(*bytes);
    const absl::Status usable =
        header.ok() ? CheckStateIdentity(*header, expected) : header.status();
    if (!usable.ok()) {
      loaded.skipped.push_back(absl::StrCat(path, ": ", usable.message()));
      continue;
    }
    loaded.path = path;
    loaded.bytes = std::move(*bytes);
    loaded.header = std::move(*header);
    return loaded;
  }
  return absl::NotFoundError(
      absl::StrCat("no usable checkpoint in ", dir, ": ", absl::StrJoin(loaded.skipped, "; ")));
}

}  // namespace ddp
