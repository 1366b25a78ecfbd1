// The TCP meeting point of ranks launched without mpirun (see communicator.h): rank 0 listens,
// every other rank connects (retrying until rank 0 listens or the timeout passes), rank 0 sends
// the payload to each and waits for every acknowledgement, so no rank leaves before all have it.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/parallel/communicator.h"

namespace tessel {
namespace {

using Clock = std::chrono::steady_clock;

// A socket closed when it goes out of scope.
class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Socket& operator=(Socket&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

[[noreturn]] void fail_socket(const TcpRendezvous& r, const char* what) {
  throw Error(detail::concat("TCP rendezvous at ", r.address, ":", r.port, " (rank ", r.rank, " of ", r.size, "): ", what,
                             " failed: ", std::strerror(errno)));
}

// Sends or receives exactly `bytes` bytes.
void send_all(const TcpRendezvous& r, int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail_socket(r, "send");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}
void receive_all(const TcpRendezvous& r, int fd, void* data, size_t bytes) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) throw Error(detail::concat("TCP rendezvous at ", r.address, ":", r.port, ": the peer closed the connection early"));
    if (n < 0) fail_socket(r, "recv");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

// A receive timeout on `fd`, so that a rank that never shows up ends in an Error, not a hang.
void set_timeout(const TcpRendezvous& r, int fd) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(r.timeout_s);
  tv.tv_usec = static_cast<suseconds_t>((r.timeout_s - static_cast<double>(tv.tv_sec)) * 1e6);
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0) fail_socket(r, "setsockopt(SO_RCVTIMEO)");
}

addrinfo* resolve(const TcpRendezvous& r, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(r.port);
  const int status = ::getaddrinfo(passive ? nullptr : r.address.c_str(), port.c_str(), &hints, &found);
  if (status != 0)
    throw Error(detail::concat("TCP rendezvous: cannot resolve ", r.address, ":", r.port, ": ", ::gai_strerror(status)));
  return found;
}

uint64_t to_wire(uint64_t value) {  // little-endian on the wire
  uint64_t wire = 0;
  for (int i = 0; i < 8; ++i) reinterpret_cast<unsigned char*>(&wire)[i] = static_cast<unsigned char>(value >> (8 * i));
  return wire;
}
uint64_t from_wire(uint64_t wire) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= static_cast<uint64_t>(reinterpret_cast<const unsigned char*>(&wire)[i]) << (8 * i);
  return value;
}

std::vector<uint8_t> serve(const TcpRendezvous& r, const std::vector<uint8_t>& payload) {
  addrinfo* address = resolve(r, true);
  Socket listener(::socket(address->ai_family, address->ai_socktype, address->ai_protocol));
  const int yes = 1;
  ::setsockopt(listener.fd(), SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  const int bound = ::bind(listener.fd(), address->ai_addr, address->ai_addrlen);
  ::freeaddrinfo(address);
  if (listener.fd() < 0 || bound != 0) fail_socket(r, "bind");
  if (::listen(listener.fd(), r.size) != 0) fail_socket(r, "listen");
  set_timeout(r, listener.fd());  // accept() honours the receive timeout of the listening socket
  std::vector<Socket> peers;
  for (int i = 1; i < r.size; ++i) {
    Socket peer(::accept(listener.fd(), nullptr, nullptr));
    if (peer.fd() < 0) fail_socket(r, detail::concat("accept (", i - 1, " of ", r.size - 1, " ranks arrived)").c_str());
    set_timeout(r, peer.fd());
    const uint64_t length = to_wire(payload.size());
    send_all(r, peer.fd(), &length, sizeof length);
    send_all(r, peer.fd(), payload.data(), payload.size());
    peers.push_back(std::move(peer));
  }
  for (const Socket& peer : peers) {  // everyone has it before anyone goes on
    uint8_t ack = 0;
    receive_all(r, peer.fd(), &ack, 1);
  }
  return payload;
}

std::vector<uint8_t> join(const TcpRendezvous& r) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(r.timeout_s);
  for (;;) {
    addrinfo* address = resolve(r, false);
    Socket peer(::socket(address->ai_family, address->ai_socktype, address->ai_protocol));
    const int connected = peer.fd() < 0 ? -1 : ::connect(peer.fd(), address->ai_addr, address->ai_addrlen);
    ::freeaddrinfo(address);
    if (connected == 0) {
      set_timeout(r, peer.fd());
      uint64_t length = 0;
      receive_all(r, peer.fd(), &length, sizeof length);
      std::vector<uint8_t> payload(static_cast<size_t>(from_wire(length)));
      receive_all(r, peer.fd(), payload.data(), payload.size());
      const uint8_t ack = 1;
      send_all(r, peer.fd(), &ack, 1);
      return payload;
    }
    if (Clock::now() > deadline) fail_socket(r, "connect to rank 0");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // rank 0 is not listening yet
  }
}

}  // namespace

void TcpRendezvous::validate() const {
  if (size < 1) fail_argument("TcpRendezvous.size", ">= 1", size);
  if (rank < 0 || rank >= size) fail_argument("TcpRendezvous.rank", detail::concat("in [0, ", size, ")"), rank);
  if (port < 1 || port > 65535) fail_argument("TcpRendezvous.port", "in [1, 65535]", port);
  if (address.empty()) fail_argument("TcpRendezvous.address", "rank 0's host name or address", "empty");
  if (!(timeout_s > 0.0)) fail_argument("TcpRendezvous.timeout_s", "> 0", timeout_s);
}

std::vector<uint8_t> tcp_broadcast(const TcpRendezvous& rendezvous, const std::vector<uint8_t>& payload) {
  rendezvous.validate();
  if (rendezvous.size == 1) return payload;
  return rendezvous.rank == 0 ? serve(rendezvous, payload) : join(rendezvous);
}

}  // namespace tessel
