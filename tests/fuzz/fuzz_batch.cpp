// Batch uploads: a multipart/form-data body (first input byte odd; the Content-Type up to the
// first newline, the body after it) as POST /v1/files reads it, or a batch file (even) as
// /v1/batches validates it and the batch runner runs it, against a handler that answers at once.
// Bad input must be a duet::Error; every part must lie within the body, and the runner must
// write one line for each line of the file that is not blank.
#include <sstream>

#include "duet/core/error.h"
#include "duet/server/batch_runner.h"
#include "duet/server/multipart.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace duet;
  if (size == 0) return 0;
  const std::string text(fuzz::as_text(data + 1, size - 1));
  if ((data[0] & 1) != 0) {
    const size_t eol = text.find('\n');
    const std::string type = text.substr(0, eol);
    const std::string_view body = eol == std::string::npos ? std::string_view() : std::string_view(text).substr(eol + 1);
    try {
      for (const server::FormPart& p : server::parse_multipart(type, body)) {
        if (p.name.empty()) __builtin_trap();
        if (!p.data.empty() && (p.data.data() < body.data() || p.data.data() + p.data.size() > body.data() + body.size())) {
          __builtin_trap();
        }
      }
    } catch (const Error&) {
    }
    return 0;
  }
  std::istringstream check(text);
  int64_t requests = 0;
  server::validate_batch_lines(check, (data[0] & 2) != 0 ? "/v1/chat/completions" : "", 100, &requests);
  std::istringstream in(text);
  std::ostringstream out;
  const server::HttpHandler echo = [](server::HttpRequest&& req, std::shared_ptr<server::Responder> res) {
    res->send(req.body.size() % 2 == 0 ? 200 : 400, "application/json", req.body, {{"X-Request-Id", "r"}});
  };
  server::BatchRunOptions options;
  options.max_in_flight = 2;
  options.endpoint = (data[0] & 2) != 0 ? "/v1/chat/completions" : "";
  const server::BatchRunStats stats = server::run_batch_lines(in, out, echo, options);
  int64_t written = 0;
  for (char c : out.str()) written += c == '\n';
  if (stats.lines != requests || written != requests || stats.succeeded + stats.failed != requests) __builtin_trap();
  return 0;
}
