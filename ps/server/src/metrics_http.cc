#include "internal/metrics_http.h"

#include <civetweb.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <utility>

namespace ferry::ps {

struct MetricsHttp::Context {
  Page page;
  mg_context* mg = nullptr;
  std::string host;  // where it listens (what the poke below connects to)
  int port = 0;
  ~Context() {
    if (mg == nullptr) return;
    // civetweb's listening thread looks at its stop flag only between polls of up to 2 s; a
    // connection made after mg_stop has set the flag ends that poll at once.
    std::atomic<bool> stopped{false};
    std::thread poke([&] {
      while (!stopped.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        if (port == 0 || stopped.load()) continue;
        addrinfo hints{};
        hints.ai_socktype = SOCK_STREAM;
        addrinfo* found = nullptr;
        if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) continue;
        for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
          const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
          if (fd < 0) continue;
          const bool connected = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
          ::close(fd);
          if (connected) break;
        }
        ::freeaddrinfo(found);
      }
    });
    mg_stop(mg);
    stopped.store(true);
    poke.join();
  }
};

namespace {

int Serve(mg_connection* conn, void* data) {
  auto* ctx = static_cast<MetricsHttp::Page*>(data);
  const mg_request_info* info = mg_get_request_info(conn);
  if (info == nullptr || std::string(info->request_method) != "GET") {
    mg_send_http_error(conn, 405, "only GET");
    return 405;
  }
  std::optional<std::string> body = (*ctx)();
  if (!body) {
    mg_send_http_error(conn, 503, "the server did not answer in time; try again");
    return 503;
  }
  mg_printf(conn,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
            "Content-Length: %zu\r\nConnection: close\r\n\r\n",
            body->size());
  mg_write(conn, body->data(), body->size());
  return 200;
}

}  // namespace

StatusOr<std::unique_ptr<MetricsHttp>> MetricsHttp::Start(const std::string& bind, Page page) {
  static std::once_flag library;
  std::call_once(library, [] { mg_init_library(0); });
  std::unique_ptr<MetricsHttp> http(new MetricsHttp());
  http->ctx_ = std::make_unique<Context>();
  http->ctx_->page = std::move(page);
  const char* options[] = {"listening_ports", bind.c_str(), "num_threads", "2", "request_timeout_ms", "10000", nullptr};
  char error_text[256] = "";
  unsigned error_code = 0;
  mg_error_data error{&error_code, error_text, sizeof error_text};
  mg_callbacks callbacks{};
  mg_init_data init{&callbacks, nullptr, options};
  http->ctx_->mg = mg_start2(&init, &error);
  if (http->ctx_->mg == nullptr) {
    return UnavailableError("metrics endpoint: cannot listen on '" + bind + "': " +
                            (error_text[0] != '\0' ? std::string(error_text) : "civetweb did not start"));
  }
  mg_set_request_handler(http->ctx_->mg, "/metrics$", Serve, &http->ctx_->page);
  mg_server_port ports[1] = {};
  if (mg_get_server_ports(http->ctx_->mg, 1, ports) < 1) return UnavailableError("metrics endpoint: no port bound for '" + bind + "'");
  http->port_ = ports[0].port;
  // Bound to all interfaces (a bare port, or 0.0.0.0): the URL names this machine, and the stop
  // poke goes to loopback; otherwise both use the host as bound (brackets off an IPv6 one).
  const size_t colon = bind.rfind(':');
  std::string host = colon == std::string::npos ? std::string() : bind.substr(0, colon);
  std::string url_host = host;
  if (host.empty() || host == "0.0.0.0") {
    char name[256] = "";
    url_host = ::gethostname(name, sizeof name - 1) == 0 && name[0] != '\0' ? name : "127.0.0.1";
    host = "127.0.0.1";
  } else if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  http->url_ = "http://" + url_host + ":" + std::to_string(http->port_) + "/metrics";
  http->ctx_->host = host;
  http->ctx_->port = http->port_;
  return http;
}

MetricsHttp::~MetricsHttp() = default;

}  // namespace ferry::ps
