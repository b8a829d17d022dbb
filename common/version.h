#ifndef DDP_COMMON_VERSION_H_
#define DDP_COMMON_VERSION_H_

namespace ddp {

// Workers and the coordinator must run the same version: the assignment
// carries the whole job spec, and both sides must read it the same way.
inline constexpr char kVersion[] = DDP_VERSION_STRING;

}  // namespace ddp

#endif  // DDP_COMMON_VERSION_H_
