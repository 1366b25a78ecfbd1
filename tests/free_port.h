// A free TCP port for tests that start a rendezvous (TcpRendezvous) of their own.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tessel/core/error.h"

namespace tessel::testing {

// A port nobody listens on now: the kernel's choice for a socket bound to port 0 (concurrent test
// processes on one machine must not meet at a port derived from something they share).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0)
    throw Error("free_port: no socket");
  ::close(fd);
  return ntohs(address.sin_port);
}

}  // namespace tessel::testing
