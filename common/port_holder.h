// Who holds a TCP port on this machine, for the error a person reads when a
// daemon can't listen: "in use by pid 4242 (ddp-coordinator)". Read from
// /proc (the listening sockets, then which process has one open); a process
// of another user whose /proc this one can't read is not named.
#ifndef DDP_COMMON_PORT_HOLDER_H_
#define DDP_COMMON_PORT_HOLDER_H_

#include <string>

namespace ddp {

// "pid N (name)" of a process listening on TCP `port` (any address), or
// "another process" when none can be named. Bounded: reads at most a few
// thousand /proc entries.
std::string DescribePortHolder(int port);

// Whether some socket listens on TCP `port` (any address), by /proc/net.
bool PortListened(int port);

// Why a server could not listen on `listen` (HOST:PORT), for its error:
// "port 29400 is in use by pid 4242 (ddp-coordinator)" when the port is
// taken, else a guess at the cause.
std::string WhyCantListen(const std::string& listen);

}  // namespace ddp

#endif  // DDP_COMMON_PORT_HOLDER_H_
