// An asynchronous HTTP/1.1 server on Boost.Beast: keep-alive, no thread per connection, a small
// pool of I/O threads. A handler gets each request and answers it once, either with a whole
// response or as a stream of chunks (server-sent events), from any thread: everything that
// touches the socket is posted to the connection's strand, so the engine thread never blocks on
// a socket. A client that goes away mid-request is reported through the stream's disconnect
// callback.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace duet::server {

struct HttpRequest {
  std::string method;
  std::string target;  // path and query as sent
  std::string path;    // without the query
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string remote;  // peer address
  // Made in this process (a batch file's line), not read from a connection: its runner bounds
  // how many wait, so the queue limits that protect the server from its clients do not apply.
  bool internal = false;

  std::string header(const std::string& lower_name) const;
};

// A body handed to the socket piece by piece as the client takes it (a file's contents), so a
// large one never sits in memory whole: read(offset, max) returns up to `max` bytes from `offset`
// (an empty piece only when the body ended before `size`); it runs on an I/O thread and may throw.
struct BodySource {
  uint64_t size = 0;
  std::function<std::string(uint64_t offset, size_t max)> read;
};
// The piece of a BodySource read and written at a time: what one download holds in memory.
inline constexpr size_t kBodyPiece = 256 << 10;

// One reply channel per request. Exactly one of send(), send_body() or start_stream() is used;
// after start_stream(), write() and finish() may be called from any thread.
class Responder {
 public:
  virtual ~Responder() = default;
  virtual void send(int status, const std::string& content_type, std::string body,
                    std::vector<std::pair<std::string, std::string>> headers = {}) = 0;
  // A reply of `body.size` bytes with Content-Length, read as the socket drains. A body that
  // cannot be read to its end closes the connection mid-reply (the client sees it cut short).
  // This default reads it whole and send()s it (replies that never reach a socket). Inline, as
  // every member but the socket's: code that links no HTTP server (the fuzzers) has the class.
  virtual void send_body(int status, const std::string& content_type, BodySource body,
                         std::vector<std::pair<std::string, std::string>> headers = {}) {
    std::string whole;
    while (whole.size() < body.size) {
      std::string piece = body.read(whole.size(), static_cast<size_t>(std::min<uint64_t>(kBodyPiece, body.size - whole.size())));
      if (piece.empty()) break;
      whole += piece;
    }
    if (whole.size() > body.size) whole.resize(static_cast<size_t>(body.size));
    send(status, content_type, std::move(whole), std::move(headers));
  }
  virtual void start_stream(int status, const std::string& content_type,
                            std::vector<std::pair<std::string, std::string>> headers = {}) = 0;
  virtual void write(std::string chunk) = 0;
  virtual void finish() = 0;
  // Called once, from an I/O thread, if the client disconnects before the reply is complete.
  virtual void on_disconnect(std::function<void()> callback) = 0;
  virtual bool disconnected() const = 0;
};

// A reply channel that passes everything on to another: the base of those that change a part of
// it (add headers, keep events, reshape errors).
class ForwardingResponder : public Responder {
 public:
  explicit ForwardingResponder(std::shared_ptr<Responder> inner) : inner_(std::move(inner)) {}
  void send(int status, const std::string& content_type, std::string body,
            std::vector<std::pair<std::string, std::string>> headers) override {
    inner_->send(status, content_type, std::move(body), std::move(headers));
  }
  void send_body(int status, const std::string& content_type, BodySource body,
                 std::vector<std::pair<std::string, std::string>> headers) override {
    inner_->send_body(status, content_type, std::move(body), std::move(headers));
  }
  void start_stream(int status, const std::string& content_type,
                    std::vector<std::pair<std::string, std::string>> headers) override {
    inner_->start_stream(status, content_type, std::move(headers));
  }
  void write(std::string chunk) override { inner_->write(std::move(chunk)); }
  void finish() override { inner_->finish(); }
  void on_disconnect(std::function<void()> callback) override { inner_->on_disconnect(std::move(callback)); }
  bool disconnected() const override { return inner_->disconnected(); }

 protected:
  std::shared_ptr<Responder> inner_;
};

using HttpHandler = std::function<void(HttpRequest&&, std::shared_ptr<Responder>)>;

// Raises the soft limit on open files to the hard limit and returns the new soft limit (every
// connection is one). HttpServer::start calls it.
uint64_t raise_open_file_limit();

struct HttpServerConfig {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;          // 0: any free port (see HttpServer::port)
  int io_threads = 2;
  uint64_t max_body_bytes = 8 << 20;  // larger bodies get 413
  int idle_timeout_seconds = 120;     // keep-alive connections idle longer are closed
  // HTTPS when tls_cert_file is set: PEM files of the certificate chain and its private key.
  std::string tls_cert_file;
  std::string tls_key_file;
  // Clients' certificates (mutual TLS), checked against the CAs in tls_ca_file: 0 not asked for,
  // 1 checked when a client sends one, 2 required (vLLM's --ssl-cert-reqs).
  std::string tls_ca_file;
  int tls_client_certs = 0;
};

class HttpServer {
 public:
  HttpServer(const HttpServerConfig& config, HttpHandler handler);
  ~HttpServer();

  // Binds and listens (throws kUnavailable naming the address on failure), then serves on the
  // I/O threads.
  void start();
  uint16_t port() const { return port_; }
  // Stops accepting new connections; open ones go on.
  void stop_accepting();
  // Closes everything and joins the I/O threads.
  void stop();
  int64_t open_connections() const;
  // Accepts that failed for want of file descriptors or memory, since the start.
  int64_t accept_failures() const;
  const char* scheme() const;  // "https" with TLS, else "http"

  struct Impl;  // the sessions of http_server.cpp reach it; not for use elsewhere

 private:
  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
};

}  // namespace duet::server
