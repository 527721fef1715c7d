// The HTTP layer: the input is the bytes a client sends on one connection (requests, pipelined or
// cut short), to a running HttpServer whose handler answers whole bodies and streams. After each
// input the server must still answer a plain request on a new connection.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "duet/server/http_server.h"
#include "fuzz_common.h"

namespace {

using duet::server::HttpRequest;
using duet::server::HttpServer;
using duet::server::Responder;

void handle(HttpRequest&& req, std::shared_ptr<Responder> res) {
  if (req.path == "/stream") {
    res->start_stream(200, "text/event-stream");
    for (int i = 0; i < 3; ++i) res->write("data: " + std::to_string(i) + "\n\n");
    res->finish();
    return;
  }
  res->send(200, "text/plain", req.method + " " + req.target + " " + std::to_string(req.body.size()) + " " +
                                   req.header("content-type"));
}

HttpServer& server() {
  static HttpServer* s = [] {
    duet::server::HttpServerConfig config;
    config.host = "127.0.0.1";
    config.port = 0;
    config.io_threads = 2;
    config.max_body_bytes = 64 << 10;
    config.idle_timeout_seconds = 2;
    auto* server = new HttpServer(config, handle);  // lives for the whole run
    server->start();
    return server;
  }();
  return *s;
}

// Sends `bytes` on a new connection, closes its sending side when `half_close` (the server takes
// that as the client leaving, as uvicorn does: a reply still open is abandoned), and reads until
// the server closes or `seconds` pass without a byte; returns what came back.
std::string exchange(uint16_t port, const std::string& bytes, int seconds, bool half_close) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return {};
  timeval tv{seconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    if (half_close) shutdown(fd, SHUT_WR);
    char buf[4096];
    for (;;) {
      const ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      reply.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return reply;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint16_t port = server().port();
  exchange(port, std::string(duet::fuzz::as_text(data, size)), 1, true);
  // The server must still answer a new connection (three tries of 10 s each: a loaded machine may
  // drop one; a server that stopped accepting or answering fails all three).
  for (int attempt = 1;; ++attempt) {
    const std::string alive =
        exchange(port, "GET /alive HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n\r\n", 10, false);
    if (alive.rfind("HTTP/1.1 200", 0) == 0) break;
    std::fprintf(stderr, "try %d: the server did not answer: %zu bytes came back (%s), %lld connections open: %.200s\n",
                 attempt, alive.size(), std::strerror(errno), static_cast<long long>(server().open_connections()),
                 alive.c_str());
    if (attempt == 3) __builtin_trap();
  }
  return 0;
}
