#include "duet/core/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/format.h>

#include "duet/core/error.h"

namespace duet {
namespace {

constexpr uint32_t kMatchLimit = 1000000;  // backtracking steps of one match: milliseconds

}  // namespace

std::string pcre2_error_message(int code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  return n < 0 ? fmt::format("PCRE2 error {}", code) : std::string(reinterpret_cast<const char*>(buffer));
}

struct Regex::Impl {
  std::string pattern;
  std::string what;
  pcre2_code* code = nullptr;
  pcre2_match_context* context = nullptr;
  ~Impl() {
    pcre2_match_context_free(context);
    pcre2_code_free(code);
  }
};

Regex::Regex(std::string_view pattern, std::string_view what) : impl_(std::make_unique<Impl>()) {
  impl_->pattern = pattern;
  impl_->what = what;
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), 0, &error, &offset, nullptr);
  if (impl_->code == nullptr) {
    fail(ErrorCode::kInvalidArgument, "{} '{}' is not a valid regular expression (at offset {}): {}", what, pattern,
         offset, pcre2_error_message(error));
  }
  impl_->context = pcre2_match_context_create(nullptr);
  if (impl_->context == nullptr) throw std::bad_alloc();
  pcre2_set_match_limit(impl_->context, kMatchLimit);
}

Regex::~Regex() = default;

bool Regex::search(std::string_view text) const {
  const std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create_from_pattern(impl_->code, nullptr), &pcre2_match_data_free);
  if (data == nullptr) throw std::bad_alloc();
  const int rc = pcre2_match(impl_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, 0, data.get(),
                             impl_->context);
  if (rc >= 0) return true;
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  fail(ErrorCode::kInvalidArgument, "{} '{}' could not be matched against a text of {} bytes: {}", impl_->what,
       impl_->pattern, text.size(), pcre2_error_message(rc));
}

}  // namespace duet
