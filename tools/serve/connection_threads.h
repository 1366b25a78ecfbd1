// cpp-httplib's task queue for `tessel serve`: every accepted connection on a thread of its own, so
// an idle keep-alive connection, a client that trickles its request a byte at a time, or one that
// stops reading its answer costs one thread and never holds a handler another client needs:
// /health and every other request keep being answered while hundreds of such connections are open.
// httplib's default is a fixed pool, which 16 idle connections fill for 30 s.
//
// At most `max_connections` connections are served at once. The next `overflow` ones each get a
// thread too, but overloaded() is true there, and the server answers them 503 at once (and closes
// them); past those, accepting waits for a connection to end (the listen backlog holds the rest).
#pragma once

#include <httplib.h>

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>

namespace tessel::serve {

class ConnectionThreads : public httplib::TaskQueue {
 public:
  ConnectionThreads(size_t max_connections, size_t overflow);
  ~ConnectionThreads() override;

  void enqueue(std::function<void()> fn) override;
  // Waits until every connection's thread has finished (their reads and writes time out).
  void shutdown() override;

  // True on the thread of a connection admitted past max_connections.
  static bool overloaded();
  size_t active() const;

 private:
  const size_t max_connections_, overflow_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  size_t active_ = 0;
};

}  // namespace tessel::serve
