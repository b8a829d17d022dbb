// What the library throws: a std::runtime_error whose message says what
// went wrong and what to do, like LibTorch's c10::Error.
#ifndef DDP_INCLUDE_DDP_ERROR_H_
#define DDP_INCLUDE_DDP_ERROR_H_

#include <stdexcept>
#include <string>

namespace ddp {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace ddp

#endif  // DDP_INCLUDE_DDP_ERROR_H_
