#include "ferry/metrics/http.h"

#include <microhttpd.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <cstring>
#include <utility>

namespace ferry::metrics {

struct HttpEndpoint::Context {
  Render render;
  MHD_Daemon* daemon = nullptr;
  ~Context() {
    if (daemon != nullptr) MHD_stop_daemon(daemon);  // closes the socket, joins its threads
  }
};

namespace {

MHD_Result Reply(MHD_Connection* conn, unsigned status, const std::string& body, const char* type) {
  MHD_Response* response =
      MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;  // out of memory: libmicrohttpd closes the connection
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  const MHD_Result queued = MHD_queue_response(conn, status, response);
  MHD_destroy_response(response);
  return queued;
}

// libmicrohttpd's request handler: answers at its first call (a GET carries no body to wait for).
MHD_Result Serve(void* cls, MHD_Connection* conn, const char* url, const char* method, const char* /*version*/,
                 const char* /*upload_data*/, size_t* /*upload_data_size*/, void** /*request_state*/) {
  const auto& render = *static_cast<const HttpEndpoint::Render*>(cls);
  if (std::strcmp(url, "/metrics") != 0) {
    return Reply(conn, MHD_HTTP_NOT_FOUND, "not found: the page is /metrics\n", "text/plain");
  }
  if (std::strcmp(method, MHD_HTTP_METHOD_GET) != 0) {
    return Reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET\n", "text/plain");
  }
  const std::optional<std::string> body = render();
  if (!body) {
    return Reply(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "the program did not answer in time; try again\n", "text/plain");
  }
  return Reply(conn, MHD_HTTP_OK, *body, "text/plain; version=0.0.4; charset=utf-8");
}

}  // namespace

StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(const std::string& bind, Render render) {
  auto refused = [&](const std::string& why) {
    return UnavailableError("metrics endpoint: cannot listen on '" + bind + "': " + why);
  };
  // "PORT" or "HOST:PORT" (an IPv6 host in brackets).
  const size_t colon = bind.rfind(':');
  std::string host = colon == std::string::npos ? std::string() : bind.substr(0, colon);
  const std::string port_text = colon == std::string::npos ? bind : bind.substr(colon + 1);
  int port = -1;
  const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 0 || port > 65535) {
    return refused("the port must be a number in [0, 65535] (0: a free one)");
  }
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  // A bare port: every IPv4 interface, as 0.0.0.0.
  addrinfo hints{};
  hints.ai_family = host.empty() ? AF_INET : AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int e = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_text.c_str(), &hints, &found); e != 0) {
    return refused(::gai_strerror(e));
  }
  sockaddr_storage address{};
  std::memcpy(&address, found->ai_addr, found->ai_addrlen);
  ::freeaddrinfo(found);

  std::unique_ptr<HttpEndpoint> http(new HttpEndpoint());
  http->ctx_ = std::make_unique<Context>();
  http->ctx_->render = std::move(render);
  // Two threads of libmicrohttpd's own (default stacks), each with its own poll loop. A client
  // that says nothing for kIdleSeconds is closed; one address holds at most kPerAddress
  // connections (more are closed at once), so that slow or idle clients from one host (a
  // slowloris) cannot take the kConnections from a scraper elsewhere.
  const unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | (address.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
  http->ctx_->daemon = MHD_start_daemon(
      flags, 0, nullptr, nullptr, &Serve, &http->ctx_->render, MHD_OPTION_SOCK_ADDR,
      reinterpret_cast<sockaddr*>(&address), MHD_OPTION_THREAD_POOL_SIZE, 2u, MHD_OPTION_CONNECTION_TIMEOUT,
      kIdleSeconds, MHD_OPTION_CONNECTION_LIMIT, kConnections, MHD_OPTION_PER_IP_CONNECTION_LIMIT, kPerAddress,
      MHD_OPTION_END);
  if (http->ctx_->daemon == nullptr) return refused("the address is in use or not this machine's");
  const MHD_DaemonInfo* info = MHD_get_daemon_info(http->ctx_->daemon, MHD_DAEMON_INFO_BIND_PORT);
  if (info == nullptr || info->port == 0) return refused("no port bound");
  http->port_ = info->port;
  // Bound to all interfaces (a bare port, or 0.0.0.0): the URL names this machine; otherwise the
  // host as given.
  std::string url_host = colon == std::string::npos ? std::string() : bind.substr(0, colon);
  if (url_host.empty() || url_host == "0.0.0.0") {
    char name[256] = "";
    url_host = ::gethostname(name, sizeof name - 1) == 0 && name[0] != '\0' ? name : "127.0.0.1";
  }
  http->url_ = "http://" + url_host + ":" + std::to_string(http->port_) + "/metrics";
  return http;
}

HttpEndpoint::~HttpEndpoint() = default;

}  // namespace ferry::metrics
