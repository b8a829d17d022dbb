#include "coordinator/leadership.h"

#include "absl/strings/str_cat.h"

namespace ddp {

std::string NotLeaderMessage(const std::string& leader, const std::string& etcd_trouble) {
  const std::string etcd =
      etcd_trouble.empty()
          ? ""
          : absl::StrCat(" (and etcd can't be reached from here: ", etcd_trouble, ")");
  if (leader.empty()) {
    return absl::StrCat("this coordinator is not the leader, and no leader is known yet",
                        etcd.empty() ? " (an election is under way); try again shortly" : etcd);
  }
  return absl::StrCat("this coordinator is not the leader; the leader ",
                      etcd.empty() ? "is at " : "was last seen at ", leader, etcd);
}

}  // namespace ddp
