#include "duet/server/http_server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <deque>
#include <fstream>
#include <iterator>
#include <optional>
#include <utility>  // before Asio: Boost 1.74 needs std::exchange declared

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "duet/core/error.h"
#include "duet/core/log.h"

namespace duet::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

constexpr int kWriteTimeoutSeconds = 60;
// How long the acceptor waits after an accept that failed for want of file descriptors or
// memory: connections wait in the listen queue meanwhile, and retrying at once would spin a core
// and write a log line per try.
constexpr auto kAcceptRetry = std::chrono::milliseconds(100);
// Below this many open files a server cannot hold the thousands of streams it is built for.
constexpr uint64_t kFewOpenFiles = 4096;

}  // namespace

std::string HttpRequest::header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? std::string() : it->second;
}

struct HttpServer::Impl {
  Impl(const HttpServerConfig& c, HttpHandler h)
      : config(c), handler(std::move(h)), accept_strand(net::make_strand(ioc)), acceptor(accept_strand),
        accept_retry(accept_strand) {}

  void accept();
  void accepted(beast::error_code ec, tcp::socket socket);

  HttpServerConfig config;
  HttpHandler handler;
  net::io_context ioc;
  // The acceptor, its retry timer and the failure count are used on this strand only.
  net::strand<net::io_context::executor_type> accept_strand;
  tcp::acceptor acceptor;
  net::steady_timer accept_retry;
  int64_t accept_failures = 0;  // in a row, since the last accepted connection
  std::atomic<int64_t> accept_failures_total{0};
  std::optional<net::ssl::context> tls;  // HTTPS: every connection starts with a TLS handshake
  std::vector<std::thread> threads;
  std::atomic<int64_t> connections{0};
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
};

namespace {

class Session;

// The reply channel of one request; it keeps its session alive until the reply is complete.
class SessionResponder final : public Responder {
 public:
  explicit SessionResponder(std::shared_ptr<Session> session) : session_(std::move(session)) {}
  void send(int status, const std::string& content_type, std::string body,
            std::vector<std::pair<std::string, std::string>> headers) override;
  void send_body(int status, const std::string& content_type, BodySource body,
                 std::vector<std::pair<std::string, std::string>> headers) override;
  void start_stream(int status, const std::string& content_type,
                    std::vector<std::pair<std::string, std::string>> headers) override;
  void write(std::string chunk) override;
  void finish() override;
  void on_disconnect(std::function<void()> callback) override;
  bool disconnected() const override { return disconnected_.load(); }

  // Called on the session's strand.
  void notify_disconnect() {
    if (disconnected_.exchange(true)) return;
    std::function<void()> cb;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      cb = std::move(callback_);
    }
    if (cb) cb();
  }
  void detach() {
    std::lock_guard<std::mutex> lock(mutex_);
    session_.reset();
  }

 private:
  std::shared_ptr<Session> session();

  std::mutex mutex_;
  std::shared_ptr<Session> session_;
  std::function<void()> callback_;
  std::atomic<bool> disconnected_{false};
};

// What a reply channel needs of its connection, plain or TLS. Replies are always made on the
// connection's strand (get_executor()).
class Session {
 public:
  virtual ~Session() = default;
  virtual net::any_io_executor get_executor() = 0;
  virtual void send(int status, const std::string& content_type, std::string body,
                    const std::vector<std::pair<std::string, std::string>>& headers) = 0;
  virtual void send_body(int status, const std::string& content_type, std::shared_ptr<BodySource> body,
                         const std::vector<std::pair<std::string, std::string>>& headers) = 0;
  virtual void start_stream(int status, const std::string& content_type,
                            const std::vector<std::pair<std::string, std::string>>& headers) = 0;
  virtual void write_chunk(std::string chunk) = 0;
  virtual void finish_stream() = 0;
};

// One connection over Stream: beast::tcp_stream, or beast::ssl_stream of one for HTTPS.
template <class Stream>
class BasicSession final : public Session, public std::enable_shared_from_this<BasicSession<Stream>> {
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

 public:
  template <class... StreamArgs>
  explicit BasicSession(HttpServer::Impl& server, StreamArgs&&... stream_args)
      : stream_(std::forward<StreamArgs>(stream_args)...), server_(server), poll_(stream_.get_executor()) {
    ++server_.connections;
    beast::error_code ec;
    const tcp::endpoint peer = lowest().socket().remote_endpoint(ec);
    if (!ec) remote_ = fmt::format("{}:{}", peer.address().to_string(), peer.port());
  }
  ~BasicSession() override { --server_.connections; }

  void run() {
    net::dispatch(stream_.get_executor(), [self = this->shared_from_this()] {
      if constexpr (kTls) {
        // The handshake has the idle timeout: a client that connects and says nothing goes.
        self->lowest().expires_after(std::chrono::seconds(self->server_.config.idle_timeout_seconds));
        self->stream_.async_handshake(net::ssl::stream_base::server, [self](beast::error_code ec) {
          if (ec) {
            spdlog::debug("TLS handshake with {} failed: {}", self->remote_, ec.message());
            return self->close();
          }
          self->read();
        });
      } else {
        self->read();
      }
    });
  }
  net::any_io_executor get_executor() override { return stream_.get_executor(); }

  // --- reply, always on the strand ---
  void send(int status, const std::string& content_type, std::string body,
            const std::vector<std::pair<std::string, std::string>>& headers) override {
    if (!reply_open_) return;
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(status), 11);
    res->set(http::field::server, "duet");
    res->set(http::field::content_type, content_type);
    for (const auto& [k, v] : headers) res->set(k, v);
    res->keep_alive(keep_alive_);
    res->body() = std::move(body);
    res->prepare_payload();
    lowest().expires_after(std::chrono::seconds(kWriteTimeoutSeconds));
    http::async_write(stream_, *res, [self = this->shared_from_this(), res](beast::error_code ec, size_t) {
      self->reply_done(ec);
    });
  }

  void send_body(int status, const std::string& content_type, std::shared_ptr<BodySource> body,
                 const std::vector<std::pair<std::string, std::string>>& headers) override {
    if (!reply_open_) return;
    open_header(status, content_type, headers);
    stream_header_->content_length(body->size);
    serializer_ = std::make_shared<http::response_serializer<http::empty_body>>(*stream_header_);
    lowest().expires_after(std::chrono::seconds(kWriteTimeoutSeconds));
    http::async_write_header(stream_, *serializer_, [self = this->shared_from_this(), body](beast::error_code ec, size_t) {
      if (ec) return self->fail_stream();
      self->write_body(body, 0);
    });
  }

  void start_stream(int status, const std::string& content_type,
                    const std::vector<std::pair<std::string, std::string>>& headers) override {
    if (!reply_open_) return;
    // no-cache unless the caller's headers say otherwise.
    std::vector<std::pair<std::string, std::string>> all = {{"Cache-Control", "no-cache"}};
    all.insert(all.end(), headers.begin(), headers.end());
    open_header(status, content_type, all);
    stream_header_->chunked(true);
    serializer_ = std::make_shared<http::response_serializer<http::empty_body>>(*stream_header_);
    writing_ = true;
    lowest().expires_after(std::chrono::seconds(kWriteTimeoutSeconds));
    http::async_write_header(stream_, *serializer_, [self = this->shared_from_this()](beast::error_code ec, size_t) {
      self->writing_ = false;
      if (ec) return self->fail_stream();
      self->header_written_ = true;
      self->flush();
    });
  }

  void write_chunk(std::string chunk) override {
    if (!reply_open_ || chunk.empty()) return;
    pending_.push_back(std::make_shared<std::string>(std::move(chunk)));
    flush();
  }

  void finish_stream() override {
    if (!reply_open_) return;
    finish_requested_ = true;
    flush();
  }

  void attach(std::shared_ptr<SessionResponder> responder) { responder_ = std::move(responder); }

 private:
  beast::tcp_stream& lowest() { return beast::get_lowest_layer(stream_); }

  void read() {
    parser_.emplace();
    parser_->body_limit(server_.config.max_body_bytes);
    parser_->header_limit(64 * 1024);
    lowest().expires_after(std::chrono::seconds(server_.config.idle_timeout_seconds));
    http::async_read_header(stream_, buffer_, *parser_, [self = this->shared_from_this()](beast::error_code ec, size_t) {
      self->on_header(ec);
    });
  }

  // A client that sent "Expect: 100-continue" waits for the go-ahead before it sends the body
  // (curl does for large bodies, and waited a second for it, then sent anyway).
  void on_header(beast::error_code ec) {
    if (ec || parser_->is_done()) return on_read(ec);
    if (!beast::iequals(parser_->get()[http::field::expect], "100-continue")) return read_body();
    auto go_ahead = std::make_shared<http::response<http::empty_body>>(http::status::continue_, 11);
    lowest().expires_after(std::chrono::seconds(kWriteTimeoutSeconds));
    http::async_write(stream_, *go_ahead, [self = this->shared_from_this(), go_ahead](beast::error_code write_ec, size_t) {
      if (write_ec) return self->close();
      self->read_body();
    });
  }

  void read_body() {
    lowest().expires_after(std::chrono::seconds(server_.config.idle_timeout_seconds));
    http::async_read(stream_, buffer_, *parser_, [self = this->shared_from_this()](beast::error_code ec, size_t) {
      self->on_read(ec);
    });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted ||
        ec == net::ssl::error::stream_truncated) {  // a TLS client that closed without its alert
      return close();
    }
    if (ec) {
      const bool too_large = ec == http::error::body_limit || ec == http::error::header_limit ||
                             ec == http::error::buffer_overflow;
      keep_alive_ = false;
      reply_open_ = true;
      const int status = too_large ? 413 : 400;
      const std::string message = too_large ? fmt::format("request body is larger than the limit of {} bytes",
                                                          server_.config.max_body_bytes)
                                            : fmt::format("malformed HTTP request: {}", ec.message());
      const nlohmann::json body = {
          {"error", {{"message", message}, {"type", "invalid_request_error"}, {"param", nullptr}, {"code", status}}}};
      send(status, "application/json", body.dump(), {});
      return;
    }
    http::request<http::string_body> req = parser_->release();
    HttpRequest r;
    r.method = std::string(req.method_string());
    r.target = std::string(req.target());
    r.path = r.target.substr(0, r.target.find('?'));
    for (const auto& field : req) {
      std::string name(field.name_string());
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      r.headers[name] = std::string(field.value());
    }
    r.body = std::move(req.body());
    r.remote = remote_;
    keep_alive_ = req.keep_alive();
    reply_open_ = true;
    ++request_number_;
    header_written_ = false;
    finish_requested_ = false;
    pending_.clear();
    lowest().expires_never();
    auto responder = std::make_shared<SessionResponder>(this->shared_from_this());
    responder_ = responder;
    watch_disconnect();
    server_.handler(std::move(r), responder);
  }

  // While a reply is open, a socket that reads as closed means the client left. A wait left over
  // from an earlier request on this connection is recognised by its number. The wait can also
  // wake for nothing (an edge of readiness from data the request's read already took), so the
  // socket is asked without blocking: end of stream or an error is a disconnect, no data yet
  // means wait again, data (a pipelined request, a TLS record) hands the watch to
  // poll_peer_closed.
  void watch_disconnect() {
    lowest().socket().async_wait(tcp::socket::wait_read, net::bind_executor(
        stream_.get_executor(), [self = this->shared_from_this(), number = request_number_](beast::error_code ec) {
          if (!self->reply_open_ || number != self->request_number_) return;
          if (ec == net::error::operation_aborted) return;
          if (!ec) {
            char byte;
            const ssize_t n = ::recv(self->lowest().socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
            if (n > 0) return self->poll_peer_closed(number);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
              return self->watch_disconnect();
            }
          }
          self->fail_stream();
        }));
  }

  // Data waits unread on the socket (a pipelined request, or TLS records such as the alert a
  // client sends as it closes), so readiness says no more: the connection's TCP state is asked
  // once a second instead, and the peer's FIN (CLOSE_WAIT) is a disconnect.
  void poll_peer_closed(uint64_t number) {
    poll_.expires_after(std::chrono::seconds(1));
    poll_.async_wait([self = this->shared_from_this(), number](beast::error_code ec) {
      if (ec || !self->reply_open_ || number != self->request_number_) return;
      tcp_info info{};
      socklen_t size = sizeof info;
      const int fd = self->lowest().socket().native_handle();
      if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &size) != 0 || info.tcpi_state == TCP_CLOSE_WAIT ||
          info.tcpi_state == TCP_CLOSE) {
        return self->fail_stream();
      }
      self->poll_peer_closed(number);
    });
  }

  void flush() {
    if (writing_ || !header_written_ || !reply_open_) return;
    if (pending_.empty()) {
      if (!finish_requested_) return;
      writing_ = true;
      lowest().expires_after(std::chrono::seconds(kWriteTimeoutSeconds));
      net::async_write(stream_, http::make_chunk_last(), [self = this->shared_from_this()](beast::error_code ec, size_t) {
        self->writing_ = false;
        self->reply_done(ec);
      });
      return;
    }
    std::shared_ptr<std::string> data = pending_.front();
    pending_.pop_front();
    writing_ = true;
    lowest().expires_after(std::chrono::seconds(kWriteTimeoutSeconds));
    net::async_write(stream_, http::make_chunk(net::buffer(*data)),
                     [self = this->shared_from_this(), data](beast::error_code ec, size_t) {
                       self->writing_ = false;
                       if (ec) return self->fail_stream();
                       self->flush();
                     });
  }

  // The header of a reply whose body follows it (send_body, start_stream), in stream_header_.
  void open_header(int status, const std::string& content_type,
                   const std::vector<std::pair<std::string, std::string>>& headers) {
    stream_header_ = std::make_shared<http::response<http::empty_body>>(static_cast<http::status>(status), 11);
    stream_header_->set(http::field::server, "duet");
    stream_header_->set(http::field::content_type, content_type);
    for (const auto& [k, v] : headers) stream_header_->set(k, v);
    stream_header_->keep_alive(keep_alive_);
  }

  // send_body's pieces, one read and written at a time from `offset`.
  void write_body(const std::shared_ptr<BodySource>& body, uint64_t offset) {
    if (!reply_open_) return;
    if (offset >= body->size) return reply_done({});
    auto piece = std::make_shared<std::string>();
    try {
      *piece = body->read(offset, static_cast<size_t>(std::min<uint64_t>(kBodyPiece, body->size - offset)));
    } catch (const std::exception& e) {
      spdlog::warn("a reply's body could not be read past byte {} of {}: {}", offset, body->size, e.what());
      piece->clear();
    }
    if (piece->empty()) {
      if (offset < body->size) spdlog::warn("a reply's body ended at byte {} of {}; the connection is closed", offset, body->size);
      return fail_stream();
    }
    if (piece->size() > body->size - offset) piece->resize(static_cast<size_t>(body->size - offset));
    lowest().expires_after(std::chrono::seconds(kWriteTimeoutSeconds));
    net::async_write(stream_, net::buffer(*piece),
                     [self = this->shared_from_this(), body, piece, offset](beast::error_code ec, size_t) {
                       if (ec) return self->fail_stream();
                       self->write_body(body, offset + piece->size());
                     });
  }

  void fail_stream() {
    if (!reply_open_) return;
    reply_open_ = false;
    if (auto r = responder_) {
      r->notify_disconnect();
      r->detach();
    }
    responder_.reset();
    close();
  }

  void reply_done(beast::error_code ec) {
    reply_open_ = false;
    if (auto r = responder_) r->detach();
    responder_.reset();
    pending_.clear();
    serializer_.reset();
    stream_header_.reset();
    if (ec || !keep_alive_) return close();
    read();
  }

  void close() {
    poll_.cancel();
    beast::error_code ec;
    lowest().socket().shutdown(tcp::socket::shutdown_both, ec);
    lowest().socket().close(ec);
  }

  Stream stream_;
  HttpServer::Impl& server_;
  net::steady_timer poll_;  // poll_peer_closed's
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string remote_;
  bool keep_alive_ = false;
  bool reply_open_ = false;
  bool header_written_ = false;
  bool writing_ = false;
  bool finish_requested_ = false;
  uint64_t request_number_ = 0;
  std::deque<std::shared_ptr<std::string>> pending_;
  std::shared_ptr<http::response<http::empty_body>> stream_header_;
  std::shared_ptr<http::response_serializer<http::empty_body>> serializer_;
  std::shared_ptr<SessionResponder> responder_;
};

std::shared_ptr<Session> SessionResponder::session() {
  std::lock_guard<std::mutex> lock(mutex_);
  return session_;
}

void SessionResponder::send(int status, const std::string& content_type, std::string body,
                            std::vector<std::pair<std::string, std::string>> headers) {
  auto s = session();
  if (!s) return;
  net::post(s->get_executor(), [s, status, content_type, body = std::move(body), headers = std::move(headers)]() mutable {
    s->send(status, content_type, std::move(body), headers);
  });
}

void SessionResponder::send_body(int status, const std::string& content_type, BodySource body,
                                 std::vector<std::pair<std::string, std::string>> headers) {
  auto s = session();
  if (!s) return;
  net::post(s->get_executor(), [s, status, content_type, body = std::make_shared<BodySource>(std::move(body)),
                                headers = std::move(headers)] { s->send_body(status, content_type, body, headers); });
}

void SessionResponder::start_stream(int status, const std::string& content_type,
                                    std::vector<std::pair<std::string, std::string>> headers) {
  auto s = session();
  if (!s) return;
  net::post(s->get_executor(), [s, status, content_type, headers = std::move(headers)] {
    s->start_stream(status, content_type, headers);
  });
}

void SessionResponder::write(std::string chunk) {
  auto s = session();
  if (!s) return;
  net::post(s->get_executor(), [s, chunk = std::move(chunk)]() mutable { s->write_chunk(std::move(chunk)); });
}

void SessionResponder::finish() {
  auto s = session();
  if (!s) return;
  net::post(s->get_executor(), [s] { s->finish_stream(); });
}

void SessionResponder::on_disconnect(std::function<void()> callback) {
  bool call_now = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (disconnected_.load()) call_now = true;
    else callback_ = std::move(callback);
  }
  if (call_now && callback) callback();
}

}  // namespace

void HttpServer::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    accepted(ec, std::move(socket));
  });
}

void HttpServer::Impl::accepted(beast::error_code ec, tcp::socket socket) {
  if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
  if (!ec) {
    if (accept_failures > 0) {
      spdlog::info("accepting connections again after {} failed tries", accept_failures);
      accept_failures = 0;
    }
    beast::error_code nd;
    socket.set_option(tcp::no_delay(true), nd);
    if (tls) {
      std::make_shared<BasicSession<beast::ssl_stream<beast::tcp_stream>>>(*this, std::move(socket), *tls)->run();
    } else {
      std::make_shared<BasicSession<beast::tcp_stream>>(*this, std::move(socket))->run();
    }
    accept();
    return;
  }
  // A client that gave up before its connection was accepted: the next one is unaffected.
  if (ec == net::error::connection_aborted) {
    accept();
    return;
  }
  // Out of file descriptors or memory: wait for open connections to close (one line in the log
  // for the whole episode).
  ++accept_failures_total;
  if (accept_failures++ == 0) {
    spdlog::warn("accept failed: {} ({} connections open); new connections wait in the listen queue, retried every "
                 "{} ms",
                 ec.message(), connections.load(), kAcceptRetry.count());
  }
  accept_retry.expires_after(kAcceptRetry);
  accept_retry.async_wait([this](beast::error_code wait_ec) {
    if (!wait_ec && acceptor.is_open()) accept();
  });
}

// The server's side of TLS: its certificate chain and key, and the clients' certificates when
// asked for. TLS 1.2 and 1.3 only.
net::ssl::context make_tls_context(const HttpServerConfig& c) {
  net::ssl::context ctx(net::ssl::context::tls_server);
  ctx.set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 | net::ssl::context::no_sslv3 |
                  net::ssl::context::no_tlsv1 | net::ssl::context::no_tlsv1_1 | net::ssl::context::single_dh_use);
  beast::error_code ec;
  ctx.use_certificate_chain_file(c.tls_cert_file, ec);
  if (ec) fail(ErrorCode::kInvalidArgument, "--ssl-certfile '{}': {}", c.tls_cert_file, ec.message());
  // No pass phrase: OpenSSL would otherwise ask for one on the terminal and wait.
  ctx.set_password_callback([](std::size_t, net::ssl::context::password_purpose) { return std::string(); });
  ctx.use_private_key_file(c.tls_key_file, net::ssl::context::pem, ec);
  if (ec) {
    std::ifstream key(c.tls_key_file);
    const std::string text((std::istreambuf_iterator<char>(key)), std::istreambuf_iterator<char>());
    fail(ErrorCode::kInvalidArgument, "--ssl-keyfile '{}': {}", c.tls_key_file,
         text.find("ENCRYPTED") != std::string::npos
             ? "the key is encrypted; give it unencrypted (openssl pkey -in KEY -out PLAIN.key), readable by duet only"
             : ec.message());
  }
  if (!c.tls_ca_file.empty()) {
    ctx.load_verify_file(c.tls_ca_file, ec);
    if (ec) fail(ErrorCode::kInvalidArgument, "--ssl-ca-certs '{}': {}", c.tls_ca_file, ec.message());
  }
  if (c.tls_client_certs > 0) {
    ctx.set_verify_mode(net::ssl::verify_peer | (c.tls_client_certs == 2 ? net::ssl::verify_fail_if_no_peer_cert : 0));
  }
  return ctx;
}

HttpServer::HttpServer(const HttpServerConfig& config, HttpHandler handler)
    : impl_(std::make_unique<Impl>(config, std::move(handler))) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  Impl& s = *impl_;
  if (!s.config.tls_cert_file.empty()) s.tls.emplace(make_tls_context(s.config));
  const uint64_t files = raise_open_file_limit();
  if (files < kFewOpenFiles) {
    spdlog::warn("at most {} files may be open (RLIMIT_NOFILE, hard limit): about as many connections at once; "
                 "raise it (ulimit -Hn) to serve thousands of streams",
                 files);
  }
  beast::error_code ec;
  const net::ip::address address = net::ip::make_address(s.config.host, ec);
  if (ec) fail(ErrorCode::kInvalidArgument, "--host '{}' is not an IP address: {}", s.config.host, ec.message());
  const tcp::endpoint endpoint(address, s.config.port);
  s.acceptor.open(endpoint.protocol(), ec);
  if (!ec) s.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(endpoint, ec);
  if (!ec) s.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) fail(ErrorCode::kUnavailable, "cannot listen on {}:{}: {}", s.config.host, s.config.port, ec.message());
  port_ = s.acceptor.local_endpoint().port();
  s.work.emplace(s.ioc.get_executor());
  s.accept();
  for (int i = 0; i < std::max(1, s.config.io_threads); ++i) s.threads.emplace_back([&s] { s.ioc.run(); });
}

void HttpServer::stop_accepting() {
  net::post(impl_->accept_strand, [this] {
    beast::error_code ec;
    impl_->acceptor.close(ec);
    impl_->accept_retry.cancel();
  });
}

void HttpServer::stop() {
  if (!impl_) return;
  impl_->work.reset();
  impl_->ioc.stop();
  for (std::thread& t : impl_->threads) {
    if (t.joinable()) t.join();
  }
  impl_->threads.clear();
}

int64_t HttpServer::open_connections() const { return impl_->connections.load(); }

int64_t HttpServer::accept_failures() const { return impl_->accept_failures_total.load(); }

const char* HttpServer::scheme() const { return impl_->config.tls_cert_file.empty() ? "http" : "https"; }

uint64_t raise_open_file_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return 1024;
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  return lim.rlim_cur == RLIM_INFINITY ? UINT64_MAX : static_cast<uint64_t>(lim.rlim_cur);
}

}  // namespace duet::server
