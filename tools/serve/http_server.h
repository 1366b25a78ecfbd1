// The HTTP front of `tessel serve` (cpp-httplib): the OpenAI-style image and video endpoints, health,
// models and Prometheus metrics over an Engine, with API-key checks, body limits, queue-full 429s
// and JSON errors naming the field. Every generation request gets exactly one HTTP answer.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "openai_api.h"
#include "tessel/engine/engine.h"

namespace tessel::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (the chosen one is printed)
  std::string api_key;  // empty: no authentication
  // Admits a 720p PNG or JPEG reference image as base64 in JSON or as a multipart part.
  size_t max_body_bytes = 16 << 20;
  // Connections served at once, each on its own thread (connection_threads.h); the next 64 are
  // answered 503 at once.
  int max_connections = 1024;
  std::chrono::seconds io_timeout{30};  // each read of a request and each write of a response
  std::chrono::seconds keep_alive_timeout{5};  // an idle keep-alive connection is closed after this
  // How long POST /v1/images/generations waits for its images before cancelling them (504).
  std::chrono::seconds image_timeout{3600};
  int retry_after_seconds = 1;  // the Retry-After of a 429
  ApiDefaults api;
};

class HttpServer {
 public:
  HttpServer(engine::Engine& engine, ServerOptions options);
  ~HttpServer();
  // Binds the listening socket; returns the port. Throws Error when it cannot.
  int bind();
  // Serves until stop(); returns once every connection's handler finished.
  void run();
  // Closes the listening socket (callable from another thread, e.g. a signal watcher).
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessel::serve
