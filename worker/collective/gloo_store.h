// The coordinator's rendezvous store, as the gloo::rendezvous::Store that
// Gloo's full-mesh rendezvous reads and writes. Keys live under "gloo/" in
// the client's job and generation.
#ifndef DDP_WORKER_COLLECTIVE_GLOO_STORE_H_
#define DDP_WORKER_COLLECTIVE_GLOO_STORE_H_

#include <chrono>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/store_client.h"
#include "gloo/rendezvous/store.h"

namespace ddp {

// Gloo's interface reports failure by throwing: gloo::IoException with the
// store's message.
class CoordinatorGlooStore final : public gloo::rendezvous::Store {
 public:
  // `client` outlives the store; gets wait at most `timeout`.
  CoordinatorGlooStore(StoreClient* client, absl::Duration timeout)
      : client_(client), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  static std::string Key(const std::string& key) { return "gloo/" + key; }
  StoreClient* client_;
  absl::Duration timeout_;
};

}  // namespace ddp

#endif  // DDP_WORKER_COLLECTIVE_GLOO_STORE_H_
