#include "worker/confinement.h"

#include <fcntl.h>
#include <linux/landlock.h>
#include <linux/openat2.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/logging.h"

namespace ddp {
namespace {

// The rights of each Landlock ABI (linux/landlock.h may predate some).
constexpr uint64_t kExecute = 1ULL << 0;
constexpr uint64_t kWriteFile = 1ULL << 1;
constexpr uint64_t kReadFile = 1ULL << 2;
constexpr uint64_t kReadDir = 1ULL << 3;
constexpr uint64_t kRemoveDir = 1ULL << 4;
constexpr uint64_t kRemoveFile = 1ULL << 5;
constexpr uint64_t kMakeDir = 1ULL << 7;
constexpr uint64_t kMakeReg = 1ULL << 8;
constexpr uint64_t kAbi1All = (1ULL << 13) - 1;  // EXECUTE .. MAKE_SYM
constexpr uint64_t kRefer = 1ULL << 13;          // ABI 2
constexpr uint64_t kTruncate = 1ULL << 14;       // ABI 3
constexpr uint64_t kIoctlDev = 1ULL << 15;       // ABI 5
// The rights that apply to a file (the others only to folders).
constexpr uint64_t kFileRights = kExecute | kWriteFile | kReadFile | kTruncate | kIoctlDev;

// Only handled_access_fs: the kernel takes a struct smaller than its own.
struct RulesetAttr {
  uint64_t handled_access_fs;
};
struct PathBeneathAttr {
  uint64_t allowed_access;
  int32_t parent_fd;
} __attribute__((packed));

constexpr unsigned kCreateRulesetVersion = 1U << 0;
constexpr int kRulePathBeneath = 1;

uint64_t HandledFor(int abi) {
  uint64_t handled = kAbi1All;
  if (abi >= 2) handled |= kRefer;
  if (abi >= 3) handled |= kTruncate;
  if (abi >= 5) handled |= kIoctlDev;
  return handled;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// `path` as O_PATH; `no_links`: without following any symbolic link on it
// (openat2's RESOLVE_NO_SYMLINKS; where the kernel lacks openat2, the last
// component at least).
int OpenPath(const std::string& path, bool no_links) {
  if (!no_links) return ::open(path.c_str(), O_PATH | O_CLOEXEC);
  struct open_how how = {};
  how.flags = O_PATH | O_CLOEXEC;
  how.resolve = RESOLVE_NO_SYMLINKS;
  const long fd = ::syscall(SYS_openat2, AT_FDCWD, path.c_str(), &how, sizeof(how));
  if (fd >= 0 || errno != ENOSYS) return static_cast<int>(fd);
  return ::open(path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
}

// Allows `rights` (masked to what the kernel handles) beneath `path`;
// a path that doesn't exist is skipped (nothing there to allow).
absl::Status Allow(int ruleset, const std::string& path, uint64_t rights, uint64_t handled,
                   bool required, bool no_links = false) {
  Fd fd(OpenPath(path, no_links));
  if (fd.get() < 0) {
    if (no_links && errno == ELOOP) {
      return absl::InvalidArgumentError(absl::StrCat(
          "can't confine the job to ", path,
          ": a symbolic link lies on it now, where the job's check found none (re-pointed "
          "since?); refusing to follow it"));
    }
    if (!required && (errno == ENOENT || errno == ENOTDIR)) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("can't confine the job to ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return absl::InternalError(absl::StrCat("can't stat ", path, ": ", std::strerror(errno)));
  }
  PathBeneathAttr rule{};
  rule.allowed_access = rights & handled & (S_ISDIR(st.st_mode) ? ~0ULL : kFileRights);
  rule.parent_fd = fd.get();
  if (rule.allowed_access == 0) return absl::OkStatus();
  if (::syscall(SYS_landlock_add_rule, ruleset, kRulePathBeneath, &rule, 0) != 0) {
    return absl::InternalError(
        absl::StrCat("landlock_add_rule(", path, "): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status ApplyLandlock(const Confinement& c, int abi) {
  const uint64_t handled = HandledFor(abi);
  RulesetAttr attr{handled};
  const int ruleset =
      static_cast<int>(::syscall(SYS_landlock_create_ruleset, &attr, sizeof(attr), 0));
  if (ruleset < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("landlock_create_ruleset: ", std::strerror(errno)));
  }
  Fd owner(ruleset);
  const uint64_t read = kReadFile | kReadDir;
  const uint64_t write =
      read | kWriteFile | kRemoveDir | kRemoveFile | kMakeDir | kMakeReg | kRefer | kTruncate;
  // The system's libraries and what libc and LibTorch read as they run.
  // /proc/self names this process only (resolved now).
  for (const char* path : {"/usr", "/lib", "/lib64", "/lib32"}) {
    if (absl::Status s = Allow(ruleset, path, read | kExecute, handled, false); !s.ok()) return s;
  }
  for (const char* path :
       {"/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/hosts",
        "/etc/nsswitch.conf", "/etc/resolv.conf", "/etc/gai.conf", "/etc/host.conf", "/proc/self",
        "/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/sys", "/dev/null", "/dev/urandom"}) {
    if (absl::Status s = Allow(ruleset, path, read, handled, false); !s.ok()) return s;
  }
  // The shared-memory communicator's segments (0600, so other users' stay
  // out of reach whatever this allows).
  if (absl::Status s = Allow(ruleset, "/dev/shm", write, handled, false); !s.ok()) return s;
  if (c.gpu) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/dev", ec)) {
      const std::string name = entry.path().filename();
      if (!absl::StartsWith(name, "nvidia")) continue;
      if (absl::Status s =
              Allow(ruleset, entry.path(), read | kWriteFile | kIoctlDev, handled, false);
          !s.ok()) {
        return s;
      }
    }
    for (const char* path : {"/proc/driver/nvidia"}) {
      if (absl::Status s = Allow(ruleset, path, read, handled, false); !s.ok()) return s;
    }
  }
  for (const std::string& path : c.read) {
    if (absl::Status s = Allow(ruleset, path, read, handled, true); !s.ok()) return s;
  }
  for (const std::string& path : c.read_checked) {
    if (absl::Status s = Allow(ruleset, path, read, handled, true, /*no_links=*/true); !s.ok()) {
      return s;
    }
  }
  for (const auto* folders : {&c.write, &c.write_checked}) {
    const bool checked = folders == &c.write_checked;
    for (const std::string& path : *folders) {
      struct stat st;
      if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) {
        std::error_code ec;
        std::filesystem::create_directories(path, ec);
        if (!ec) ::chmod(path.c_str(), 0750);
      }
      // One that can't be made stays out of reach; its user (the
      // checkpoint writer) says why, and training goes on without it.
      if (absl::Status s = Allow(ruleset, path, write, handled, false, /*no_links=*/checked);
          !s.ok()) {
        return s;
      }
    }
  }
  for (const std::string& path : c.write_files) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (fd >= 0) ::close(fd);
    if (absl::Status s = Allow(ruleset, path, kReadFile | kWriteFile | kTruncate, handled, true);
        !s.ok()) {
      return s;
    }
  }
  if (::syscall(SYS_landlock_restrict_self, ruleset, 0) != 0) {
    return absl::InternalError(absl::StrCat("landlock_restrict_self: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

class SeccompFilter {
 public:
  SeccompFilter() : ctx_(seccomp_init(SCMP_ACT_ALLOW)) {}
  ~SeccompFilter() {
    if (ctx_ != nullptr) seccomp_release(ctx_);
  }
  SeccompFilter(const SeccompFilter&) = delete;
  SeccompFilter& operator=(const SeccompFilter&) = delete;

  template <typename... Args>
  void Refuse(int error, int syscall, Args... args) {
    const int rc = seccomp_rule_add(ctx_, SCMP_ACT_ERRNO(error), syscall,
                                    static_cast<unsigned>(sizeof...(args)), args...);
    // A syscall this architecture lacks (-EFAULT / -EDOM) needs no rule.
    if (rc != 0 && rc != -EFAULT && rc != -EDOM && status_.ok()) {
      status_ = absl::InternalError(
          absl::StrCat("seccomp rule for syscall ", syscall, ": ", std::strerror(-rc)));
    }
  }
  absl::Status Load() {
    if (ctx_ == nullptr) return absl::InternalError("seccomp_init failed");
    if (!status_.ok()) return status_;
    if (const int rc = seccomp_load(ctx_); rc != 0) {
      return absl::FailedPreconditionError(absl::StrCat("seccomp_load: ", std::strerror(-rc)));
    }
    return absl::OkStatus();
  }

 private:
  scmp_filter_ctx ctx_;
  absl::Status status_;
};

absl::Status ApplySeccomp() {
  SeccompFilter f;
  // New processes and programs. Threads (clone with CLONE_THREAD) stay
  // allowed; clone3's flags sit in memory a filter can't read, so it says
  // ENOSYS and libc falls back to clone.
  f.Refuse(EPERM, SCMP_SYS(fork));
  f.Refuse(EPERM, SCMP_SYS(vfork));
  f.Refuse(EPERM, SCMP_SYS(clone), SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0));
  f.Refuse(ENOSYS, SCMP_SYS(clone3));
  f.Refuse(EPERM, SCMP_SYS(execve));
  f.Refuse(EPERM, SCMP_SYS(execveat));
  // Other processes: their memory, their signals.
  for (int call : {SCMP_SYS(ptrace), SCMP_SYS(process_vm_readv), SCMP_SYS(process_vm_writev),
                   SCMP_SYS(pidfd_open), SCMP_SYS(pidfd_getfd), SCMP_SYS(pidfd_send_signal)}) {
    f.Refuse(EPERM, call);
  }
  // Signals, limits and priorities only for this process: not its daemon
  // (a job's process's parent), not the coordinator, not another job's.
  const auto self = static_cast<scmp_datum_t>(::getpid());
  f.Refuse(EPERM, SCMP_SYS(kill), SCMP_A0(SCMP_CMP_NE, self));
  f.Refuse(EPERM, SCMP_SYS(tgkill), SCMP_A0(SCMP_CMP_NE, self));
  f.Refuse(EPERM, SCMP_SYS(rt_sigqueueinfo), SCMP_A0(SCMP_CMP_NE, self));
  f.Refuse(EPERM, SCMP_SYS(rt_tgsigqueueinfo), SCMP_A0(SCMP_CMP_NE, self));
  // A thread id names no process; libc signals its threads with tgkill.
  f.Refuse(EPERM, SCMP_SYS(tkill));
  // 0 is the caller (what libc passes); any other pid, no.
  f.Refuse(EPERM, SCMP_SYS(prlimit64), SCMP_A0(SCMP_CMP_NE, 0));
  f.Refuse(EPERM, SCMP_SYS(setpriority), SCMP_A1(SCMP_CMP_NE, 0));
  f.Refuse(EPERM, SCMP_SYS(ioprio_set), SCMP_A1(SCMP_CMP_NE, 0));
  // The kernel's larger surfaces, none of which training needs.
  for (int call : {SCMP_SYS(unshare), SCMP_SYS(setns), SCMP_SYS(bpf), SCMP_SYS(perf_event_open),
                   SCMP_SYS(io_uring_setup), SCMP_SYS(userfaultfd), SCMP_SYS(keyctl),
                   SCMP_SYS(add_key), SCMP_SYS(request_key), SCMP_SYS(mount), SCMP_SYS(umount2),
                   SCMP_SYS(chroot), SCMP_SYS(pivot_root)}) {
    f.Refuse(EPERM, call);
  }
  // Sockets: TCP for the communicator and the coordinator, Unix, route
  // netlink (getaddrinfo); every other family, and UDP or raw inet, no.
  for (int family = 0; family <= AF_NETLINK; ++family) {
    if (family == AF_UNIX || family == AF_INET || family == AF_INET6 || family == AF_NETLINK) {
      continue;
    }
    f.Refuse(EPERM, SCMP_SYS(socket), SCMP_A0(SCMP_CMP_EQ, static_cast<scmp_datum_t>(family)));
  }
  f.Refuse(EPERM, SCMP_SYS(socket), SCMP_A0(SCMP_CMP_GT, static_cast<scmp_datum_t>(AF_NETLINK)));
  f.Refuse(EPERM, SCMP_SYS(socket), SCMP_A0(SCMP_CMP_EQ, AF_NETLINK),
           SCMP_A2(SCMP_CMP_NE, 0 /* NETLINK_ROUTE */));
  for (int family : {AF_INET, AF_INET6}) {
    for (int type : {SOCK_DGRAM, SOCK_RAW, SOCK_PACKET, SOCK_RDM}) {
      f.Refuse(EPERM, SCMP_SYS(socket), SCMP_A0(SCMP_CMP_EQ, static_cast<scmp_datum_t>(family)),
               SCMP_A1(SCMP_CMP_MASKED_EQ, 0xf, static_cast<scmp_datum_t>(type)));
    }
  }
  return f.Load();
}

}  // namespace

Confinement ConfinementForJob(const v1::JobSpec& spec, const JobConfinementOptions& options) {
  Confinement c;
  c.gpu = options.gpu;
  // Where the inputs were when checked: a worker reads them there. A path
  // as submitted that a pin stands for (the model, an image folder's
  // listing) is not resolved again now: a link on it re-pointed since would
  // lead the rule elsewhere. The rest (a folder whose files are pinned one
  // by one, shards, a job of an older coordinator's) still are: see
  // docs/SECURITY.md's known gaps.
  std::set<std::string> pinned;
  for (const v1::InputFile& pin : spec.input_files()) {
    if (pin.real_path().empty()) continue;
    c.read_checked.push_back(pin.real_path());
    pinned.insert(pin.path());
  }
  auto read = [&](const std::string& path) {
    if (!path.empty() && pinned.count(path) == 0) c.read.push_back(path);
  };
  read(spec.model().path());
  read(spec.dataset().path());
  read(spec.dataset().test_path());
  read(spec.dataset().manifest());
  read(spec.dataset().test_manifest());
  // The write folders likewise: where they led when checked, opened now
  // without following a link (one put on the way since is refused, and a
  // writer that follows it is refused by Landlock). A job of an older
  // coordinator has none pinned: its folders as named.
  std::set<std::string> pinned_fields;
  for (const v1::WriteFolder& folder : spec.write_folders()) {
    if (folder.real_path().empty()) continue;
    c.write_checked.push_back(folder.real_path());
    pinned_fields.insert(folder.field());
  }
  if (!spec.checkpoint().dir().empty() && pinned_fields.count("checkpoint.dir") == 0) {
    c.write.push_back(spec.checkpoint().dir());
  }
  if (!spec.output_path().empty() && pinned_fields.count("output_path") == 0) {
    c.write.push_back(std::filesystem::path(spec.output_path()).parent_path().string());
  }
  for (const std::string& path : options.files) {
    if (!path.empty()) c.write_files.push_back(path);
  }
  return c;
}

namespace {

// The spec digest a job's process confined itself to, whole (set while it
// was one thread; read by the threads it started after).
std::string& ProcessConfinedTo() {
  static auto* digest = new std::string;
  return *digest;
}

// Confines the calling thread to the job; where the kernel can't, the
// worker's --allow_unconfined decides. `applied`: whether it is confined.
absl::Status Confine(const v1::JobSpec& spec, const JobConfinementOptions& options, bool* applied) {
  absl::Status s = ConfineThisThread(ConfinementForJob(spec, options));
  *applied = s.ok();
  if (s.ok() || s.code() != absl::StatusCode::kFailedPrecondition) return s;
  if (options.allow_unconfined) {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      DDP_LOG(Warning) << "running job code unconfined (--allow_unconfined): " << s.message();
    });
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("this worker can't confine a job's code (", s.message(),
                   "), and runs none unconfined unless started with --allow_unconfined"));
}

}  // namespace

absl::Status ConfineJobThread(const v1::JobSpec& spec, const JobConfinementOptions& options) {
  // A second layer of the same rules would only slow every system call.
  if (!ProcessConfinedTo().empty() && ProcessConfinedTo() == SpecDigest(spec)) {
    return absl::OkStatus();
  }
  bool applied = false;
  return Confine(spec, options, &applied);
}

absl::Status ConfineJobProcess(const v1::JobSpec& spec, const JobConfinementOptions& options) {
  bool applied = false;
  absl::Status s = Confine(spec, options, &applied);
  if (applied) ProcessConfinedTo() = SpecDigest(spec);
  return s;
}

absl::StatusOr<int> LandlockAbi() {
  const long abi = ::syscall(SYS_landlock_create_ruleset, nullptr, 0, kCreateRulesetVersion);
  if (abi < 0) {
    return absl::UnavailableError(
        errno == EOPNOTSUPP ? "Landlock is disabled on this kernel (boot with lsm=...,landlock)"
                            : absl::StrCat("this kernel has no Landlock (Linux 5.13 or later): ",
                                           std::strerror(errno)));
  }
  return static_cast<int>(abi);
}

absl::Status ConfineThisThread(const Confinement& confinement) {
  absl::StatusOr<int> abi = LandlockAbi();
  if (!abi.ok()) return absl::FailedPreconditionError(abi.status().message());
  // Both need it, and it is per thread too.
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    return absl::InternalError(absl::StrCat("PR_SET_NO_NEW_PRIVS: ", std::strerror(errno)));
  }
  if (absl::Status s = ApplyLandlock(confinement, *abi); !s.ok()) return s;
  return ApplySeccomp();
}

std::string ExplainRefusal(const std::string& message) {
  if (!absl::StrContains(message, "Permission denied") &&
      !absl::StrContains(message, "Operation not permitted")) {
    return message;
  }
  return absl::StrCat(message,
                      " (refused by the worker's confinement: a job's code may read only its "
                      "model, data and checkpoints and write only its output and checkpoint "
                      "folders; it may not start processes or open sockets of its own)");
}

}  // namespace ddp
