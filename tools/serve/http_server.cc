// The routes of http_server.h.
#include "http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <sstream>

#include "connection_threads.h"
#include "tessel/core/log.h"

namespace tessel::serve {
namespace {

using engine::CancelOutcome;
using engine::RequestStatus;

constexpr int kListenBacklog = 1024;
constexpr size_t kOverflowConnections = 64;  // past max_connections: answered 503 at once

void send_json(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param = "") {
  const char* type = status == 401 ? "authentication_error"
                     : status == 404 ? "not_found_error"
                     : status == 429 ? "rate_limit_error"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  send_json(res, status, error_body(message, type, param));
}

// A request's declared body length, checked from its headers before any of the body is read:
// cpp-httplib 0.11 parses Content-Length with strtoull, so "-1" or 30 digits read as a huge length
// whose body it would read and discard before answering 413, holding the connection meanwhile.
// Returns the refusal (status and message), or nothing when the framing is sound.
std::optional<std::pair<int, std::string>> body_length_refusal(const httplib::Request& req, size_t max_body_bytes) {
  const size_t count = req.get_header_value_count("Content-Length");
  if (count == 0) return std::nullopt;
  if (count > 1) return std::pair{400, std::string("Content-Length: expected one header, got ") + std::to_string(count)};
  const std::string value = req.get_header_value("Content-Length");
  const bool digits = !value.empty() && value.size() <= 18 &&
                      std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits) return std::pair{400, "Content-Length: expected a byte count (0 to 18 decimal digits), got " + quoted_excerpt(value)};
  const unsigned long long bytes = std::stoull(value);
  if (bytes > max_body_bytes)
    return std::pair{413, detail::concat("the request body is ", bytes, " bytes, more than ", max_body_bytes, " (--max-body-bytes)")};
  return std::nullopt;
}

}  // namespace

struct HttpServer::Impl {
  engine::Engine& engine;
  ServerOptions options;
  httplib::Server http;
  socket_t listening_socket = -1;  // httplib's socket type
  std::atomic<ConnectionThreads*> connections{nullptr};  // owned by httplib, made when it listens
  std::mutex counts_mutex;
  std::map<int, int64_t> responses_by_code;

  Impl(engine::Engine& e, ServerOptions o) : engine(e), options(std::move(o)) {}

  // Queues a request; on refusal fills `res` and returns "".
  std::string submit(engine::GenerationRequest request, const std::string& prefix, httplib::Response& res) {
    try {
      return engine.submit(std::move(request), prefix);
    } catch (const engine::QueueFullError& e) {
      res.set_header("Retry-After", std::to_string(options.retry_after_seconds));
      send_error(res, 429, e.what());
    } catch (const engine::NotAcceptingError& e) {  // draining: another instance (or this one restarted) may take it
      res.set_header("Retry-After", std::to_string(options.retry_after_seconds));
      send_error(res, 503, e.what());
    } catch (const Error& e) {
      // The model type's pre-processing names the field first ("width: expected ...").
      const std::string message = e.what();
      send_error(res, 400, message, message.substr(0, message.find(':')));
    }
    return "";
  }

  // Waits (up to --image-timeout) for a request answered in its own response (images,
  // /v1/videos/sync) and forgets it; the successful snapshot, or nullopt with `res` filled.
  std::optional<engine::RequestSnapshot> wait_answer(const std::string& id, const char* what, httplib::Response& res) {
    const auto deadline = std::chrono::steady_clock::now() + options.image_timeout;
    std::optional<engine::RequestSnapshot> snapshot;
    for (;;) {
      snapshot = engine.scheduler().wait(id, std::chrono::milliseconds(500));
      if (!snapshot || engine::is_final(snapshot->status)) break;
      if (std::chrono::steady_clock::now() > deadline) {
        engine.scheduler().cancel(id);
        snapshot = engine.scheduler().wait(id, std::chrono::milliseconds(60000));
        engine.scheduler().forget(id);
        send_error(res, 504, detail::concat("no ", what, " within ", options.image_timeout.count(), " s; the request was cancelled"));
        return std::nullopt;
      }
    }
    engine.scheduler().forget(id);
    if (!snapshot) send_error(res, 500, "the request's state was lost");
    else if (snapshot->status == RequestStatus::kCancelled) send_error(res, 503, snapshot->output->error);
    else if (snapshot->status != RequestStatus::kSucceeded) send_error(res, 500, "generation failed: " + snapshot->output->error);
    else return snapshot;
    return std::nullopt;
  }

  void images(const httplib::Request& req, httplib::Response& res) {
    const std::string id = submit(parse_image_request(req.body, options.api), "img", res);
    if (id.empty()) return;
    if (const auto snapshot = wait_answer(id, "images", res)) send_json(res, 200, image_response(*snapshot->output));
  }

  // A video request as JSON, or as multipart/form-data (the OpenAI SDK's form): a part with a
  // file name is an image (input_reference, last_frame: its bytes as sent), the others text fields.
  engine::GenerationRequest video_request(const httplib::Request& req) {
    if (!req.is_multipart_form_data()) return parse_video_request(req.body, options.api);
    std::vector<std::pair<std::string, std::string>> fields;
    std::map<std::string, std::string> file_parts;
    for (const auto& [name, part] : req.files) {
      if (part.filename.empty()) {
        fields.emplace_back(name, part.content);
      } else if (!file_parts.emplace(name, part.content).second) {
        throw ApiError(400, name, name + ": expected one file part, got several");
      }
    }
    return parse_video_request(video_form_to_json(fields), options.api, file_parts);
  }

  void create_video(const httplib::Request& req, httplib::Response& res) {
    const std::string id = submit(video_request(req), "video", res);
    if (id.empty()) return;
    send_json(res, 200, video_object(*engine.scheduler().snapshot(id), options.api.model_name));
  }

  // POST /v1/videos/sync (as vLLM-Omni serves it): the MP4 in the response.
  void create_video_sync(const httplib::Request& req, httplib::Response& res) {
    const std::string id = submit(video_request(req), "video", res);
    if (id.empty()) return;
    if (const auto snapshot = wait_answer(id, "video", res)) {
      const engine::EncodedMedia& media = snapshot->output->media.at(0);
      res.status = 200;
      res.set_content(media.bytes, media.mime_type.c_str());
    }
  }

  void list_videos(const httplib::Request& req, httplib::Response& res) {
    const std::string order = req.has_param("order") ? req.get_param_value("order") : "desc";
    if (order != "asc" && order != "desc") throw ApiError(400, "order", "order: expected \"asc\" or \"desc\", got " + quoted_excerpt(order));
    int64_t limit = 20;
    if (req.has_param("limit")) {
      const std::string text = req.get_param_value("limit");
      const bool digits = !text.empty() && text.size() <= 3 && text.find_first_not_of("0123456789") == std::string::npos;
      limit = digits ? std::stoll(text) : 0;
      if (limit < 1 || limit > 100) throw ApiError(400, "limit", "limit: expected an integer in 1..100, got " + quoted_excerpt(text));
    }
    const std::string after = req.has_param("after") ? req.get_param_value("after") : "";
    send_json(res, 200, video_list(engine.scheduler().list(engine::OutputKind::kVideo), options.api.model_name, after, limit, order == "desc"));
  }

  std::optional<engine::RequestSnapshot> find_video(const std::string& id, httplib::Response& res) {
    auto snapshot = engine.scheduler().snapshot(id);
    if (!snapshot || snapshot->request.kind != engine::OutputKind::kVideo) {
      send_error(res, 404, "no video " + quoted_excerpt(id), "video_id");
      return std::nullopt;
    }
    return snapshot;
  }

  void video_status(const httplib::Request& req, httplib::Response& res) {
    if (const auto snapshot = find_video(req.matches[1], res)) send_json(res, 200, video_object(*snapshot, options.api.model_name));
  }

  void video_content(const httplib::Request& req, httplib::Response& res) {
    const auto snapshot = find_video(req.matches[1], res);
    if (!snapshot) return;
    if (snapshot->status != RequestStatus::kSucceeded) {
      const std::string status = video_object(*snapshot, options.api.model_name)["status"];
      return send_error(res, 409, "video " + snapshot->request.id + " is " + status + ", not completed");
    }
    const engine::EncodedMedia& media = snapshot->output->media.at(0);
    res.status = 200;
    res.set_content(media.bytes, media.mime_type.c_str());
  }

  void delete_video(const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (!find_video(id, res)) return;
    const CancelOutcome outcome = engine.scheduler().cancel(id);
    auto snapshot = engine.scheduler().snapshot(id);
    nlohmann::json body = snapshot ? video_object(*snapshot, options.api.model_name) : nlohmann::json{{"id", id}, {"object", "video"}};
    if (outcome == CancelOutcome::kAlreadyFinished || outcome == CancelOutcome::kCancelledWhileQueued) {
      engine.scheduler().forget(id);  // its output is not kept any longer
      body["deleted"] = true;
    } else {
      body["cancel_requested"] = true;  // running: it stops after the current step
    }
    send_json(res, 200, body);
  }

  void health(httplib::Response& res) {
    const engine::EngineStats stats = engine.stats();
    const bool accepting = engine.scheduler().accepting();
    const char* status = !accepting ? "shutting_down" : stats.healthy ? "ok" : "unhealthy";
    send_json(res, accepting && stats.healthy ? 200 : 503,
              {{"status", status},
               {"model", options.api.model_name},
               {"workers", stats.worker_pids},
               {"worker_restarts", stats.worker_restarts},
               {"last_worker_error", stats.last_worker_error},
               {"queue_depth", stats.counts.queued},
               {"running", stats.counts.running}});
  }

  void models(httplib::Response& res) {
    send_json(res, 200,
              {{"object", "list"},
               {"data", {{{"id", options.api.model_name}, {"object", "model"}, {"owned_by", "tessel"},
                          {"model_type", engine.model_type()}}}}});
  }

  void metrics(httplib::Response& res) {
    const engine::EngineStats stats = engine.stats();
    std::ostringstream out;
    const auto metric = [&](const char* name, const char* type, const char* help) {
      out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
    };
    metric("tessel_queue_depth", "gauge", "Requests waiting in the queue.");
    out << "tessel_queue_depth " << stats.counts.queued << '\n';
    metric("tessel_queue_max_depth", "gauge", "The queue's bound (--max-queue).");
    out << "tessel_queue_max_depth " << engine.scheduler().max_queue() << '\n';
    metric("tessel_requests_running", "gauge", "Requests running on the workers.");
    out << "tessel_requests_running " << stats.counts.running << '\n';
    metric("tessel_requests_total", "counter", "Generation requests by final status (rejected: refused with 429).");
    out << "tessel_requests_total{status=\"succeeded\"} " << stats.counts.succeeded << '\n'
        << "tessel_requests_total{status=\"failed\"} " << stats.counts.failed << '\n'
        << "tessel_requests_total{status=\"cancelled\"} " << stats.counts.cancelled << '\n'
        << "tessel_requests_total{status=\"rejected\"} " << stats.counts.rejected_queue_full << '\n';
    metric("tessel_queue_seconds", "summary", "Time a request waited in the queue before the workers took it.");
    out << "tessel_queue_seconds_sum " << stats.queue_seconds_total << "\ntessel_queue_seconds_count " << stats.requests_started << '\n';
    // Prometheus histograms: cumulative buckets (le), then +Inf, the sum and the count.
    const auto histogram = [&](const char* name, const engine::Histogram& h) {
      for (size_t i = 0; i < h.bounds.size(); ++i) out << name << "_bucket{le=\"" << h.bounds[i] << "\"} " << h.cumulative(i) << '\n';
      out << name << "_bucket{le=\"+Inf\"} " << h.count << '\n' << name << "_sum " << h.sum << '\n' << name << "_count " << h.count << '\n';
    };
    metric("tessel_queue_wait_seconds", "histogram", "Per request: time from submission to admission into the workers' batch.");
    histogram("tessel_queue_wait_seconds", stats.queue_seconds);
    metric("tessel_batch_in_flight", "gauge", "Requests in flight on the workers now (the current batch).");
    out << "tessel_batch_in_flight " << stats.in_flight << '\n';
    metric("tessel_batch_max", "gauge", "The most requests in flight at once (--max-batch).");
    out << "tessel_batch_max " << stats.max_batch << '\n';
    metric("tessel_batch_size", "histogram", "Requests in each step of the workers' batch.");
    histogram("tessel_batch_size", stats.batch_sizes);
    metric("tessel_step_seconds", "summary", "Time of one denoising step.");
    out << "tessel_step_seconds_sum " << stats.step_seconds_total << "\ntessel_step_seconds_count " << stats.steps_total << '\n';
    metric("tessel_attention_density", "gauge", "Mean self-attention density the sparse schedule gave the last step (1: dense).");
    out << "tessel_attention_density " << stats.last_attention_density << '\n';
    metric("tessel_workers_healthy", "gauge", "1 when every worker runs.");
    out << "tessel_workers_healthy " << (stats.healthy ? 1 : 0) << '\n';
    metric("tessel_worker_restarts_total", "counter", "Worker group restarts after a worker died.");
    out << "tessel_worker_restarts_total " << stats.worker_restarts << '\n';
    if (stats.device_memory_used_bytes >= 0) {
      metric("tessel_gpu_memory_used_bytes", "gauge", "Device memory in use on rank 0's GPU at its last step.");
      out << "tessel_gpu_memory_used_bytes " << stats.device_memory_used_bytes << '\n';
    }
    if (const ConnectionThreads* queue = connections.load()) {
      metric("tessel_http_connections", "gauge", "Open HTTP connections (each on its own thread).");
      out << "tessel_http_connections " << queue->active() << '\n';
    }
    metric("tessel_http_responses_total", "counter", "HTTP responses by status code.");
    {
      std::lock_guard lock(counts_mutex);
      for (const auto& [code, count] : responses_by_code) out << "tessel_http_responses_total{code=\"" << code << "\"} " << count << '\n';
    }
    res.set_content(out.str(), "text/plain; version=0.0.4");
  }

  // Wraps a handler: API errors become their JSON answers.
  httplib::Server::Handler guarded(std::function<void(const httplib::Request&, httplib::Response&)> handler) {
    return [handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
      try {
        handler(req, res);
      } catch (const ApiError& e) {
        send_error(res, e.status(), e.what(), e.field());
      }
    };
  }

  void install_routes() {
    // The listening socket: SO_REUSEADDR (a restart can bind while old connections linger; unlike
    // httplib's default SO_REUSEPORT, a second server on the same port is an error), and its
    // descriptor kept so bind() can widen httplib's backlog of 5 pending connections.
    http.set_socket_options([this](socket_t socket) {
      int yes = 1;
      setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
      listening_socket = socket;
    });
    http.set_payload_max_length(options.max_body_bytes);
    http.set_read_timeout(options.io_timeout);
    http.set_write_timeout(options.io_timeout);
    http.set_keep_alive_max_count(100);
    http.set_keep_alive_timeout(options.keep_alive_timeout.count());
    http.new_task_queue = [this] {
      auto* queue = new ConnectionThreads(static_cast<size_t>(options.max_connections), kOverflowConnections);
      connections = queue;
      return queue;
    };
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (ConnectionThreads::overloaded()) {
        res.set_header("Retry-After", std::to_string(options.retry_after_seconds));
        res.set_header("Connection", "close");
        send_error(res, 503, detail::concat("too many connections (more than ", options.max_connections,
                                            " at once: --max-connections); retry shortly"));
        return httplib::Server::HandlerResponse::Handled;
      }
      if (const auto refusal = body_length_refusal(req, options.max_body_bytes)) {
        res.set_header("Connection", "close");  // the body that follows is not read
        send_error(res, refusal->first, refusal->second);
        return httplib::Server::HandlerResponse::Handled;
      }
      if (options.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
      if (req.get_header_value("Authorization") == "Bearer " + options.api_key) return httplib::Server::HandlerResponse::Unhandled;
      res.set_header("WWW-Authenticate", "Bearer");
      send_error(res, 401, "a valid API key is required: Authorization: Bearer <key>");
      return httplib::Server::HandlerResponse::Handled;
    });
    http.Post("/v1/images/generations", guarded([this](const auto& req, auto& res) { images(req, res); }));
    http.Post("/v1/videos", guarded([this](const auto& req, auto& res) { create_video(req, res); }));
    http.Post("/v1/videos/sync", guarded([this](const auto& req, auto& res) { create_video_sync(req, res); }));
    http.Get("/v1/videos", guarded([this](const auto& req, auto& res) { list_videos(req, res); }));
    for (const char* path : {"/v1/images/edits", "/v1/images/variations"})
      http.Post(path, [path](const auto&, auto& res) {
        send_error(res, 400, std::string(path) + ": not supported (this server generates from text: POST /v1/images/generations)", "image");
      });
    http.Get(R"(/v1/videos/([A-Za-z0-9_-]+))", guarded([this](const auto& req, auto& res) { video_status(req, res); }));
    http.Get(R"(/v1/videos/([A-Za-z0-9_-]+)/content)", guarded([this](const auto& req, auto& res) { video_content(req, res); }));
    http.Delete(R"(/v1/videos/([A-Za-z0-9_-]+))", guarded([this](const auto& req, auto& res) { delete_video(req, res); }));
    http.Get("/health", [this](const auto&, auto& res) { health(res); });
    http.Get("/v1/models", [this](const auto&, auto& res) { models(res); });
    http.Get("/metrics", [this](const auto&, auto& res) { metrics(res); });
    // Errors httplib answers itself (404 for an unknown path, 413 for an oversize body, 400 for a
    // malformed request) get a JSON body too.
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      const std::string message = res.status == 404   ? "no route " + req.method + " " + quoted_excerpt(req.path)
                                  : res.status == 413 ? "the request body is too large"
                                                      : detail::concat("HTTP status ", res.status);
      send_error(res, res.status, message);
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr error) {
      std::string message = "internal error";
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        message += std::string(": ") + e.what();
      } catch (...) {
      }
      send_error(res, 500, message);
    });
    http.set_logger([this](const httplib::Request&, const httplib::Response& res) {
      std::lock_guard lock(counts_mutex);
      ++responses_by_code[res.status];
    });
  }
};

HttpServer::HttpServer(engine::Engine& engine, ServerOptions options) : impl_(std::make_unique<Impl>(engine, std::move(options))) {
  impl_->install_routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  const ServerOptions& o = impl_->options;
  const int port = o.port == 0 ? impl_->http.bind_to_any_port(o.host) : (impl_->http.bind_to_port(o.host, o.port) ? o.port : -1);
  if (port < 0) throw Error(detail::concat("cannot listen on ", o.host, ":", o.port, " (address in use or not available)"));
  // httplib listens with a backlog of 5: a burst of clients connecting at once would see SYNs
  // dropped (a second's delay, or a failed connect). listen() again on the socket widens it.
  if (impl_->listening_socket >= 0 && ::listen(impl_->listening_socket, kListenBacklog) != 0)
    throw Error(detail::concat("cannot widen the listen backlog on ", o.host, ":", port, ": ", std::strerror(errno)));
  return port;
}

void HttpServer::run() { impl_->http.listen_after_bind(); }

void HttpServer::stop() { impl_->http.stop(); }

}  // namespace tessel::serve
