#include "common/port_holder.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/net_address.h"

namespace ddp {
namespace {

constexpr int kMaxProcesses = 65536;
constexpr int kMaxFdsPerProcess = 65536;
constexpr char kListenState[] = "0A";

// The inodes of the sockets listening on `port`, from /proc/net/tcp{,6}.
std::set<std::string> ListeningInodes(int port) {
  std::set<std::string> inodes;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
      std::vector<std::string> f = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
      if (f.size() < 10 || f[3] != kListenState) continue;
      const size_t colon = f[1].rfind(':');
      int local = 0;
      if (colon == std::string::npos ||
          !absl::SimpleHexAtoi(absl::string_view(f[1]).substr(colon + 1), &local) ||
          local != port) {
        continue;
      }
      inodes.insert(f[9]);
    }
  }
  return inodes;
}

std::string ProcessName(const std::string& pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/comm"));
  std::string name;
  std::getline(in, name);
  return name;
}

// The process with an open descriptor to one of `inodes`, or "".
std::string HolderOf(const std::set<std::string>& inodes) {
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return "";
  std::string found;
  int processes = 0;
  while (dirent* e = ::readdir(proc)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid) || ++processes > kMaxProcesses) continue;
    const std::string fd_dir = absl::StrCat("/proc/", e->d_name, "/fd");
    DIR* fds = ::opendir(fd_dir.c_str());
    if (fds == nullptr) continue;  // another user's
    int seen = 0;
    while (dirent* fd = ::readdir(fds)) {
      if (++seen > kMaxFdsPerProcess) break;
      char target[128];
      const std::string link = absl::StrCat(fd_dir, "/", fd->d_name);
      const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
      if (n <= 0) continue;
      absl::string_view t(target, static_cast<size_t>(n));
      if (!absl::ConsumePrefix(&t, "socket:[") || !absl::ConsumeSuffix(&t, "]")) continue;
      if (inodes.count(std::string(t)) > 0) {
        found = absl::StrCat("pid ", pid, " (", ProcessName(e->d_name), ")");
        break;
      }
    }
    ::closedir(fds);
    if (!found.empty()) break;
  }
  ::closedir(proc);
  return found;
}

}  // namespace

bool PortListened(int port) { return !ListeningInodes(port).empty(); }

std::string DescribePortHolder(int port) {
  const std::set<std::string> inodes = ListeningInodes(port);
  std::string holder = inodes.empty() ? "" : HolderOf(inodes);
  return holder.empty() ? "another process" : holder;
}

std::string WhyCantListen(const std::string& listen) {
  absl::StatusOr<HostPort> address = ParseHostPort(listen, /*allow_port_zero=*/true);
  if (address.ok() && address->port > 0 && PortListened(address->port)) {
    return absl::StrCat("port ", address->port, " is in use by ", DescribePortHolder(address->port),
                        ": stop it, or choose another port");
  }
  return "not an address of this host, or a port this user may not bind?";
}

}  // namespace ddp
