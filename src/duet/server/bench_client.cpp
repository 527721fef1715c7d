#include "duet/server/bench_client.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <exception>
#include <limits>
#include <optional>
#include <utility>  // before Boost: asio/awaitable.hpp (1.74) uses std::exchange without including it

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "duet/core/error.h"
#include "duet/server/http_server.h"

// GCC 11-13 warn, falsely, that asio's coroutine frames are freed by a delete that does not match
// their new (awaitable_frame_base defines both) when the frame code is inlined at -O1/-O2.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace duet::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

constexpr size_t kReadBytes = 16 * 1024;
constexpr size_t kMaxErrorBodyBytes = 64 * 1024;
constexpr size_t kMaxReasonChars = 240;
// Sockets kept for everything else (stdio, the resolver, log files) below the open-file limit.
constexpr uint64_t kSpareFiles = 32;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string clip(std::string_view s) {
  std::string out(s.substr(0, kMaxReasonChars));
  for (char& c : out) c = (c == '\n' || c == '\r') ? ' ' : c;
  if (s.size() > kMaxReasonChars) out += "...";
  return out;
}

// The message of an error body: OpenAI's {"error": {"message"}}, vLLM's {"object": "error",
// "message"}, llama.cpp's {"code", "message"}; else the text itself.
std::string error_message(std::string_view body) {
  const json j = json::parse(body, nullptr, false);
  if (j.is_object()) {
    const json* e = &j;
    if (auto it = j.find("error"); it != j.end()) {
      if (it->is_string()) return clip(it->get<std::string>());
      if (it->is_object()) e = &*it;
    }
    if (auto m = e->find("message"); m != e->end() && m->is_string()) return clip(m->get<std::string>());
  }
  return clip(body);
}

// The text a stream chunk's first choice carries: "text" (completions) or delta "content", else
// delta "reasoning_content" (chat, a reasoning model's thinking).
std::string_view choice_text(const json& choice) {
  if (!choice.is_object()) return {};
  if (auto t = choice.find("text"); t != choice.end() && t->is_string()) return t->get_ref<const std::string&>();
  auto d = choice.find("delta");
  if (d == choice.end() || !d->is_object()) return {};
  for (const char* key : {"content", "reasoning_content"}) {
    auto c = d->find(key);
    if (c != d->end() && c->is_string() && !c->get_ref<const std::string&>().empty()) {
      return c->get_ref<const std::string&>();
    }
  }
  return {};
}

// Follows the events of one completion stream and turns them into timings and counts.
class CompletionStream {
 public:
  explicit CompletionStream(Clock::time_point sent) : sent_(sent) {}

  void on_event(const SseParser::Event& ev, Clock::time_point t) {
    if (ev.type == "error") return set_error("error event: " + error_message(ev.data));
    if (ev.data == "[DONE]") {
      done_ = t;
      return;
    }
    const json j = json::parse(ev.data, nullptr, false);
    if (!j.is_object()) return set_error("an event is not a JSON object: " + clip(ev.data));
    if (j.contains("error") || j.value("object", "") == "error") {
      return set_error("error event: " + error_message(ev.data));
    }
    // Every chunk with a choice is a token's arrival, as vLLM's benchmark counts them: a token may
    // carry no text yet (part of a character) or print nothing at all.
    if (auto c = j.find("choices"); c != j.end() && c->is_array() && !c->empty()) {
      if (num_chunks_ == 0) {
        r_.ttft = seconds(t - sent_);
      } else {
        r_.itl.push_back(seconds(t - last_chunk_));
      }
      last_chunk_ = t;
      ++num_chunks_;
      if (!choice_text((*c)[0]).empty()) ++num_text_chunks_;
    }
    if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
      r_.usage_reported = true;
      r_.prompt_tokens = u->value("prompt_tokens", int64_t{-1});
      r_.output_tokens = u->value("completion_tokens", int64_t{0});
    }
  }

  void set_error(std::string reason) {
    if (r_.error.empty()) r_.error = std::move(reason);
  }

  BenchResult finish(Clock::time_point end, int64_t min_output_tokens, bool require_text) {
    r_.latency = seconds(done_.value_or(end) - sent_);
    r_.num_text_chunks = num_text_chunks_;
    if (!r_.usage_reported) r_.output_tokens = num_chunks_;
    if (r_.error.empty() && require_text && num_chunks_ == 0) set_error("the stream carried no choices");
    if (r_.error.empty() && r_.output_tokens < min_output_tokens) {
      set_error(fmt::format("generated {} of {} tokens{}", r_.output_tokens, min_output_tokens,
                            r_.usage_reported ? "" : " (chunks counted: the server sent no usage)"));
    }
    r_.success = r_.error.empty();
    return std::move(r_);
  }

 private:
  Clock::time_point sent_;
  Clock::time_point last_chunk_;
  std::optional<Clock::time_point> done_;
  int64_t num_chunks_ = 0;       // chunks with a choice
  int64_t num_text_chunks_ = 0;  // of those, the ones with text
  BenchResult r_;
};

// What every worker shares. Everything runs on the one I/O thread, so no locks.
struct Shared {
  const BenchClientConfig& config;
  net::ssl::context* tls;  // https: the client side of TLS
  const std::vector<BenchRequest>& requests;
  const std::vector<double>& send_times;
  const std::function<void(size_t)>& on_done;
  tcp::resolver::results_type endpoints;
  std::string target;
  std::string host_header;
  Clock::time_point start;
  size_t next = 0;
  size_t done = 0;
  std::vector<BenchResult> results;
};

using TlsStream = beast::ssl_stream<beast::tcp_stream>;

// One worker's keep-alive connection, over beast::tcp_stream or TlsStream.
template <class Stream>
struct Connection {
  // `tls`: the client context for a TlsStream (unused for plain TCP).
  Connection(net::any_io_executor ex, net::ssl::context* tls) : stream(make_stream(std::move(ex), tls)) {}
  static Stream make_stream(net::any_io_executor ex, net::ssl::context* tls) {
    if constexpr (std::is_same_v<Stream, TlsStream>) return Stream(std::move(ex), *tls);
    else return Stream(std::move(ex));
  }
  Stream stream;
  beast::flat_buffer buffer;
  bool open = false;
  std::array<char, kReadBytes> chunk{};

  beast::tcp_stream& lowest() { return beast::get_lowest_layer(stream); }
  void close() {
    beast::error_code ignored;
    lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
    lowest().close();
    buffer.clear();
    open = false;
  }
};

// The client side of TLS: the system's CAs and those of `ca_file`; the server's certificate must
// be valid for the URL's host.
net::ssl::context client_tls(const std::string& ca_file) {
  net::ssl::context ctx(net::ssl::context::tls_client);
  ctx.set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 | net::ssl::context::no_sslv3 |
                  net::ssl::context::no_tlsv1 | net::ssl::context::no_tlsv1_1);
  beast::error_code ec;
  ctx.set_default_verify_paths(ec);
  if (!ca_file.empty()) {
    ctx.load_verify_file(ca_file, ec);
    if (ec) fail(ErrorCode::kInvalidArgument, "--cacert '{}': {}", ca_file, ec.message());
  }
  ctx.set_verify_mode(net::ssl::verify_peer);
  return ctx;
}

// Before the handshake: the host name the server is asked for (SNI) and checked against.
void prepare_tls(TlsStream& stream, const std::string& host) {
  beast::error_code not_address;
  (void)net::ip::make_address(host, not_address);
  if (not_address) SSL_set_tlsext_host_name(stream.native_handle(), host.c_str());  // names only
  stream.set_verify_callback(net::ssl::host_name_verification(host));
}

std::string describe(const beast::error_code& ec) {
  if (ec == beast::error::timeout) return "timed out (no data)";
  if (ec == http::error::partial_message || ec == http::error::end_of_stream || ec == net::error::eof) {
    return fmt::format("the server closed the connection mid-reply ({})", ec.message());
  }
  return ec.message();
}

// Sends one request on `conn` (connecting first if needed; once more on a fresh connection if a
// reused one turns out closed before any reply) and follows its stream to the end.
template <class Stream>
net::awaitable<BenchResult> send_one(Shared& sh, Connection<Stream>& conn, const BenchRequest& req) {
  const auto timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(sh.config.timeout_seconds));
  const Clock::time_point sent = Clock::now();
  CompletionStream stream(sent);
  auto failed = [&](std::string reason) {
    stream.set_error(std::move(reason));
    BenchResult r = stream.finish(Clock::now(), 0, false);
    r.start = seconds(sent - sh.start);
    return r;
  };

  http::request<http::string_body> msg{http::verb::post, sh.target, 11};
  msg.set(http::field::host, sh.host_header);
  msg.set(http::field::user_agent, "duet-bench");
  msg.set(http::field::content_type, "application/json");
  msg.set(http::field::accept, "text/event-stream");
  if (!sh.config.api_key.empty()) msg.set(http::field::authorization, "Bearer " + sh.config.api_key);
  msg.keep_alive(true);
  msg.body() = req.body;
  msg.prepare_payload();

  beast::error_code ec;
  auto tok = net::redirect_error(net::use_awaitable, ec);
  std::optional<http::response_parser<http::buffer_body>> parser;
  for (int attempt = 0;; ++attempt) {
    const bool reused = conn.open;
    if (!reused) {
      conn.lowest().expires_after(timeout);
      co_await conn.lowest().async_connect(sh.endpoints, tok);
      if (ec) co_return failed("connect: " + describe(ec));
      conn.lowest().socket().set_option(tcp::no_delay(true), ec);
      if constexpr (std::is_same_v<Stream, TlsStream>) {
        prepare_tls(conn.stream, sh.config.url.host);
        co_await conn.stream.async_handshake(net::ssl::stream_base::client, tok);
        if (ec) {
          conn.close();
          co_return failed("TLS handshake: " + describe(ec));
        }
      }
      conn.open = true;
    }
    conn.lowest().expires_after(timeout);
    co_await http::async_write(conn.stream, msg, tok);
    parser.emplace();
    // Not boost::none: Beast 1.74 then rejects every Content-Length body (optional compare).
    parser->body_limit(std::numeric_limits<std::uint64_t>::max());
    if (!ec) {
      conn.lowest().expires_after(timeout);
      co_await http::async_read_header(conn.stream, conn.buffer, *parser, tok);
    }
    if (!ec) break;
    conn.close();
    // A keep-alive connection the server closed meanwhile: retry once on a new one.
    if (reused && attempt == 0 && !parser->got_some()) continue;
    co_return failed((reused ? "request on a reused connection: " : "request: ") + describe(ec));
  }

  const int status = parser->get().result_int();
  std::string content_type(parser->get()[http::field::content_type]);
  std::string error_body;
  SseParser sse;
  std::vector<SseParser::Event> events;
  const bool streaming = status == 200 && content_type.find("text/event-stream") != std::string::npos;
  if (status == 200 && !streaming) {
    stream.set_error(fmt::format("expected a text/event-stream reply, got '{}'", content_type));
  }
  while (!parser->is_done()) {
    parser->get().body().data = conn.chunk.data();
    parser->get().body().size = conn.chunk.size();
    conn.lowest().expires_after(timeout);
    co_await http::async_read_some(conn.stream, conn.buffer, *parser, tok);
    const Clock::time_point t = Clock::now();
    if (ec == http::error::need_buffer) ec = {};
    const size_t n = conn.chunk.size() - parser->get().body().size;
    if (n > 0 && streaming) {
      sse.feed(std::string_view(conn.chunk.data(), n), events);
      for (const SseParser::Event& ev : events) stream.on_event(ev, t);
      events.clear();
    } else if (n > 0 && error_body.size() < kMaxErrorBodyBytes) {
      error_body.append(conn.chunk.data(), n);
    }
    if (ec) {
      conn.close();
      if (status != 200) break;  // the status says enough
      co_return failed("reading the stream: " + describe(ec));
    }
  }
  const Clock::time_point end = Clock::now();
  if (!parser->keep_alive()) conn.close();
  if (status != 200) {
    co_return failed(fmt::format("HTTP {}: {}", status, error_message(error_body)));
  }
  sse.finish(events);
  for (const SseParser::Event& ev : events) stream.on_event(ev, end);
  BenchResult r = stream.finish(end, req.min_output_tokens, req.require_text);
  r.start = seconds(sent - sh.start);
  co_return r;
}

template <class Stream>
net::awaitable<void> worker(Shared& sh) {
  const auto ex = co_await net::this_coro::executor;
  Connection<Stream> conn(ex, sh.tls);
  net::steady_timer timer(ex);
  while (sh.next < sh.requests.size()) {
    const size_t i = sh.next++;
    const auto due = sh.start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(sh.send_times[i]));
    if (Clock::now() < due) {
      beast::error_code ec;
      timer.expires_at(due);
      co_await timer.async_wait(net::redirect_error(net::use_awaitable, ec));
    }
    sh.results[i] = co_await send_one(sh, conn, sh.requests[i]);
    ++sh.done;
    if (sh.on_done) sh.on_done(sh.done);
  }
  if (conn.open) conn.close();
}

// One request on a connected stream (http_call's).
template <class Stream>
HttpReply call_on(Stream& stream, http::verb verb, const BaseUrl& url, const std::string& path, std::string body,
                  const std::string& api_key) {
  std::string target = url.path_prefix + path;
  if (target.empty()) target = "/";
  http::request<http::string_body> req(verb, target, 11);
  req.set(http::field::host, url.host);
  if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
  if (verb != http::verb::get) {
    req.set(http::field::content_type, "application/octet-stream");
    req.body() = std::move(body);
    req.prepare_payload();
  }
  http::write(stream, req);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  // No limit; boost::none would be one of zero in Boost 1.74, which compares a Content-Length
  // against the empty optional (and finds it larger).
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  http::read(stream, buffer, parser);
  beast::error_code ec;
  beast::get_lowest_layer(stream).socket().shutdown(tcp::socket::shutdown_both, ec);
  return {static_cast<int>(parser.get().result_int()), std::move(parser.get().body())};
}

// Blocking reads and writes on `socket` fail after `seconds` without progress.
void set_stall_timeout(tcp::socket& socket, double seconds) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(seconds);
  tv.tv_usec = static_cast<suseconds_t>((seconds - static_cast<double>(tv.tv_sec)) * 1e6);
  setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(socket.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

}  // namespace

HttpReply http_call(const std::string& method, const BaseUrl& url, const std::string& path, std::string body,
                    double stall_seconds, const std::string& ca_file, const std::string& api_key) {
  const http::verb verb = method == "PUT" ? http::verb::put : http::verb::get;
  const std::string where = fmt::format("{}://{}:{}{}{}", url.tls ? "https" : "http", url.host, url.port, url.path_prefix, path);
  try {
    net::io_context io;
    tcp::resolver resolver(io);
    const auto endpoints = resolver.resolve(url.host, std::to_string(url.port));
    if (!url.tls) {
      tcp::socket socket(io);
      net::connect(socket, endpoints);
      set_stall_timeout(socket, stall_seconds);
      beast::tcp_stream stream(std::move(socket));
      return call_on(stream, verb, url, path, std::move(body), api_key);
    }
    net::ssl::context ctx = client_tls(ca_file);
    TlsStream stream(io, ctx);
    tcp::socket& socket = beast::get_lowest_layer(stream).socket();
    net::connect(socket, endpoints);
    set_stall_timeout(socket, stall_seconds);
    prepare_tls(stream, url.host);
    stream.handshake(net::ssl::stream_base::client);
    return call_on(stream, verb, url, path, std::move(body), api_key);
  } catch (const std::exception& e) {
    fail(ErrorCode::kUnavailable, "{} {}: {}", method, where, e.what());
  }
}

std::optional<std::string> http_get(const BaseUrl& url, const std::string& path, const std::string& api_key,
                                    const std::string& ca_file) {
  try {
    HttpReply reply = http_call("GET", url, path, {}, 5.0, ca_file, api_key);
    if (reply.status != 200) return std::nullopt;
    return std::move(reply.body);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<double> energy_joules_in_metrics(std::string_view text) {
  constexpr std::string_view kName = "duet:energy_joules_total";
  std::optional<double> total;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (!line.starts_with(kName) || line.size() == kName.size() || (line[kName.size()] != '{' && line[kName.size()] != ' ')) {
      continue;
    }
    const size_t space = line.rfind(' ');
    try {
      total = total.value_or(0.0) + std::stod(std::string(line.substr(space + 1)));
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return total;
}

BaseUrl parse_base_url(const std::string& url) {
  BaseUrl u;
  u.tls = url.starts_with("https://");
  if (!u.tls && !url.starts_with("http://")) {
    fail(ErrorCode::kInvalidArgument, "--base-url '{}' must start with http:// or https://", url);
  }
  if (u.tls) u.port = 443;
  const std::string rest = url.substr(u.tls ? 8 : 7);
  const size_t slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  if (slash != std::string::npos) u.path_prefix = rest.substr(slash);
  while (!u.path_prefix.empty() && u.path_prefix.back() == '/') u.path_prefix.pop_back();
  std::string port;
  if (authority.starts_with('[')) {  // [::1]:8000
    const size_t close = authority.find(']');
    if (close == std::string::npos) fail(ErrorCode::kInvalidArgument, "--base-url '{}' has no ']' after the IPv6 address", url);
    u.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') fail(ErrorCode::kInvalidArgument, "--base-url '{}': expected ':' after ']'", url);
      port = authority.substr(close + 2);
    }
  } else {
    const size_t colon = authority.rfind(':');
    u.host = authority.substr(0, colon);
    if (colon != std::string::npos) port = authority.substr(colon + 1);
  }
  if (u.host.empty()) fail(ErrorCode::kInvalidArgument, "--base-url '{}' has no host", url);
  if (!port.empty() || authority.ends_with(':')) {
    int p = 0;
    for (char c : port) {
      if (c < '0' || c > '9' || p > 65535) fail(ErrorCode::kInvalidArgument, "--base-url '{}' has port '{}', expected 1-65535", url, port);
      p = p * 10 + (c - '0');
    }
    if (p < 1 || p > 65535) fail(ErrorCode::kInvalidArgument, "--base-url '{}' has port '{}', expected 1-65535", url, port);
    u.port = static_cast<uint16_t>(p);
  }
  return u;
}

void SseParser::feed(std::string_view bytes, std::vector<Event>& events) {
  size_t i = 0;
  if (after_cr_ && !bytes.empty() && bytes[0] == '\n') i = 1;  // the "\n" of a "\r\n" split across reads
  after_cr_ = false;
  while (i < bytes.size()) {
    const size_t end = bytes.find_first_of("\r\n", i);
    if (end == std::string_view::npos) {
      line_.append(bytes.substr(i));
      return;
    }
    line_.append(bytes.substr(i, end - i));
    std::string current = std::move(line_);
    line_.clear();
    line(current, events);
    i = end + 1;
    if (bytes[end] == '\r') {
      if (i < bytes.size()) {
        if (bytes[i] == '\n') ++i;
      } else {
        after_cr_ = true;
      }
    }
  }
}

void SseParser::finish(std::vector<Event>& events) {
  if (!line_.empty()) {
    std::string current = std::move(line_);
    line_.clear();
    line(current, events);
  }
  dispatch(events);
  after_cr_ = false;
}

void SseParser::line(std::string_view text, std::vector<Event>& events) {
  if (text.empty()) return dispatch(events);
  if (text[0] == ':') return;  // a comment, e.g. a keep-alive ping
  const size_t colon = text.find(':');
  const std::string_view field = text.substr(0, colon);
  std::string_view value = colon == std::string_view::npos ? std::string_view() : text.substr(colon + 1);
  if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  if (field == "data" || field == "error") {
    if (field == "error") event_.type = "error";
    if (has_data_) event_.data += '\n';
    event_.data.append(value);
    has_data_ = true;
  } else if (field == "event") {
    event_.type = std::string(value);
  }  // "id", "retry" and unknown fields are ignored
}

void SseParser::dispatch(std::vector<Event>& events) {
  if (has_data_) events.push_back(std::move(event_));
  event_ = Event();
  has_data_ = false;
}

BenchRun run_bench_requests(const BenchClientConfig& config, const std::vector<BenchRequest>& requests,
                            const std::vector<double>& send_times, const std::function<void(size_t)>& on_done) {
  if (send_times.size() != requests.size()) {
    fail(ErrorCode::kInvalidArgument, "{} send times for {} requests", send_times.size(), requests.size());
  }
  const uint64_t num_workers = config.max_concurrency > 0
                                   ? std::min<uint64_t>(static_cast<uint64_t>(config.max_concurrency), requests.size())
                                   : requests.size();
  const uint64_t files = raise_open_file_limit();
  if (files != UINT64_MAX && num_workers + kSpareFiles > files) {
    fail(ErrorCode::kResourceExhausted,
         "{} concurrent requests need {} open files, but the limit (RLIMIT_NOFILE, hard) is {}; raise it "
         "(ulimit -Hn) or lower --concurrency",
         num_workers, num_workers + kSpareFiles, files);
  }
  net::io_context ioc(1);
  std::optional<net::ssl::context> tls;
  if (config.url.tls) tls.emplace(client_tls(config.ca_file));
  Shared sh{config, tls ? &*tls : nullptr, requests, send_times, on_done, {}, config.url.path_prefix + config.endpoint,
            {}, {}, 0, 0, {}};
  sh.host_header = config.url.host.find(':') != std::string::npos ? fmt::format("[{}]:{}", config.url.host, config.url.port)
                                                                   : fmt::format("{}:{}", config.url.host, config.url.port);
  beast::error_code ec;
  tcp::resolver resolver(ioc);
  sh.endpoints = resolver.resolve(config.url.host, std::to_string(config.url.port), ec);
  if (ec) fail(ErrorCode::kUnavailable, "cannot resolve '{}': {}", config.url.host, ec.message());
  sh.results.resize(requests.size());
  sh.start = Clock::now();
  for (uint64_t w = 0; w < num_workers; ++w) {
    auto rethrow = [](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);
    };
    if (tls) net::co_spawn(ioc, worker<TlsStream>(sh), rethrow);
    else net::co_spawn(ioc, worker<beast::tcp_stream>(sh), rethrow);
  }
  ioc.run();
  BenchRun run;
  run.duration_seconds = seconds(Clock::now() - sh.start);
  run.results = std::move(sh.results);
  return run;
}

}  // namespace duet::server
