#include "duet/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include <fmt/format.h>

#include "duet/core/error.h"
#include "duet/core/regex.h"
#include "duet/tokenizer/unicode.h"

namespace duet {
namespace {

// The regex lists below are the published pre-tokenizer definitions of each model family (the
// `pre_tokenizer` section of its tokenizer.json). Characters outside ASCII are written as \x{...}
// so that no editor or copy step can normalize them.

// GPT-2 (Hugging Face ByteLevel with use_regex).
constexpr std::string_view kGpt2 =
    R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)re";

// DeepSeek LLM: newlines, runs of cased letters, runs of ASCII/full-width punctuation, trailing
// whitespace, CJK runs, digit runs.
constexpr std::string_view kDeepseekLlmLetters =
    R"re(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293})re"
    R"re(\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A})re"
    R"re(\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556})re"
    R"re(\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF})re"
    R"re(\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D})re"
    R"re(\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D})re"
    R"re(\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4})re"
    R"re(\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4})re"
    R"re(\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124})re"
    R"re(\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F})re"
    R"re(\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})re"
    R"re(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F})re"
    R"re(\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17})re"
    R"re(\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3})re"
    R"re(\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF})re"
    R"re(\x{1E900}-\x{1E943}]+)re";
constexpr std::string_view kDeepseekLlmPunct =
    R"re(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)re";
constexpr std::string_view kDeepseekCjk = R"re([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)re";

// DeepSeek V3 / R1.
constexpr std::string_view kDeepseekV3Cjk = R"re([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)re";
constexpr std::string_view kDeepseekV3Main =
    R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|)re"
    R"re( ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

// Qwen2 (and the DeepSeek-R1 distills built on it), Llama 3.
constexpr std::string_view kQwen2 =
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|)re"
    R"re(\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr std::string_view kLlama3 =
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|)re"
    R"re(\s*[\r\n]+|\s+(?!\S)|\s+)re";

struct Definition {
  std::string_view name;
  std::vector<std::string_view> patterns;
  bool ignore_merges = false;
};

const std::vector<Definition>& definitions() {
  static const std::vector<Definition> defs = {
      {"default", {kGpt2}},
      {"gpt2", {kGpt2}},
      {"gpt-2", {kGpt2}},
      {"deepseek-llm", {R"re([\r\n])re", kDeepseekLlmLetters, kDeepseekLlmPunct, R"re(\s+$)re", kDeepseekCjk,
                        R"re(\p{N}+)re"}},
      {"deepseek-coder",
       {R"re([\r\n])re", R"re(\s?\p{L}+)re", R"re(\s?\p{P}+)re", kDeepseekCjk, R"re(\p{N})re"}},
      {"deepseek-v3", {R"re(\p{N}{1,3})re", kDeepseekV3Cjk, kDeepseekV3Main}},
      {"qwen2", {kQwen2}},
      {"deepseek-r1-qwen", {kQwen2}},
      {"llama3", {kLlama3}, true},
      {"llama-bpe", {kLlama3}, true},
  };
  return defs;
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
};

struct Piece {
  std::string_view text;
  bool frozen;  // invalid UTF-8: no regex sees it
};

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Regex() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(std::string_view name) : name_(name) {
  const auto& defs = definitions();
  auto it = std::find_if(defs.begin(), defs.end(), [&](const Definition& d) { return d.name == name; });
  if (it == defs.end()) {
    fail(ErrorCode::kUnsupported, "pre-tokenizer '{}' (tokenizer.ggml.pre) is not supported; supported: {}", name,
         fmt::join(supported_names(), ", "));
  }
  ignore_merges_ = it->ignore_merges;
  for (size_t i = 0; i < it->patterns.size(); ++i) {
    const std::string_view pattern = it->patterns[i];
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    auto regex = std::make_unique<Regex>();
    regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                &error, &error_offset, nullptr);
    if (regex->code == nullptr) {
      fail(ErrorCode::kInternal, "pre-tokenizer '{}': regex {} does not compile at offset {}: {}", name, i,
           error_offset, pcre2_error_message(error));
    }
    regex->jit = pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE) == 0;
    jit_ = jit_ && regex->jit;
    uint32_t captures = 0;
    pcre2_pattern_info(regex->code, PCRE2_INFO_CAPTURECOUNT, &captures);
    max_ovector_pairs_ = std::max(max_ovector_pairs_, captures + 1);
    regexes_.push_back(std::move(regex));
  }
}

PreTokenizer::~PreTokenizer() = default;

const std::vector<std::string_view>& PreTokenizer::supported_names() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> v;
    for (const Definition& d : definitions()) v.push_back(d.name);
    return v;
  }();
  return names;
}

bool PreTokenizer::is_supported(std::string_view name) {
  const auto& names = supported_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string PreTokenizer::canonical_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size());
  auto hex = [&](uint32_t cp) { out += fmt::format("\\x{{{:X}}}", cp); };
  auto hex_digits = [&](size_t from, size_t count, uint32_t& cp) {
    if (from + count > p.size()) return false;
    cp = 0;
    for (size_t k = from; k < from + count; ++k) {
      const char c = p[k];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) return false;
      cp = cp * 16 + static_cast<uint32_t>(d);
    }
    return true;
  };
  for (size_t i = 0; i < p.size();) {
    const auto c = static_cast<unsigned char>(p[i]);
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      uint32_t cp = 0;
      if (e == 'r' || e == 'n' || e == 't' || e == 'f' || e == 'v') {
        hex(e == 'r' ? 0x0D : e == 'n' ? 0x0A : e == 't' ? 0x09 : e == 'f' ? 0x0C : 0x0B);
        i += 2;
      } else if (e == 'x' && i + 2 < p.size() && p[i + 2] == '{') {
        const size_t close = p.find('}', i + 3);
        if (close != std::string_view::npos && close > i + 3 && close - (i + 3) <= 8 &&
            hex_digits(i + 3, close - (i + 3), cp)) {
          hex(cp);
          i = close + 1;
        } else {
          out.append(p.substr(i, 2));
          i += 2;
        }
      } else if (e == 'x' && hex_digits(i + 2, 2, cp)) {
        hex(cp);
        i += 4;
      } else if (e == 'u' && hex_digits(i + 2, 4, cp)) {
        hex(cp);
        i += 6;
      } else {
        out.append(p.substr(i, 2));  // \s, \p, \\, \[ ...: kept as they are
        i += 2;
      }
      continue;
    }
    if (c >= 0x20 && c < 0x7F) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    uint32_t cp = 0;
    const size_t n = decode_utf8(p, i, cp);
    if (n == 0) {  // not UTF-8: keep the byte, such a pattern matches no definition anyway
      hex(0x110000 + c);
      ++i;
      continue;
    }
    hex(cp);
    i += n;
  }
  return out;
}

std::vector<std::string> PreTokenizer::patterns_for(std::string_view name) {
  const auto& defs = definitions();
  auto it = std::find_if(defs.begin(), defs.end(), [&](const Definition& d) { return d.name == name; });
  if (it == defs.end()) {
    fail(ErrorCode::kUnsupported, "pre-tokenizer '{}' (tokenizer.ggml.pre) is not supported; supported: {}", name,
         fmt::join(supported_names(), ", "));
  }
  return {it->patterns.begin(), it->patterns.end()};
}

std::string PreTokenizer::name_for_patterns(const std::vector<std::string>& patterns) {
  std::vector<std::string> wanted;
  for (const std::string& p : patterns) wanted.push_back(canonical_pattern(p));
  std::string found;
  for (const Definition& d : definitions()) {
    if (d.patterns.size() != wanted.size()) continue;
    bool same = true;
    for (size_t i = 0; i < wanted.size() && same; ++i) same = canonical_pattern(d.patterns[i]) == wanted[i];
    // The first name of each definition, except that GPT-2's is "gpt2" rather than "default".
    if (same && (found.empty() || found == "default")) found = std::string(d.name);
  }
  return found;
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out) const {
  if (text.empty()) return;

  // Valid UTF-8 runs go to the regexes; each ill-formed subsequence is a piece of its own.
  std::vector<Piece> cur;
  std::vector<Piece> next;
  size_t run_start = 0;
  uint32_t cp = 0;
  for (size_t pos = 0; pos < text.size();) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t n = decode_utf8(text, pos, cp);
    if (n > 0) {
      pos += n;
      continue;
    }
    if (pos > run_start) cur.push_back({text.substr(run_start, pos - run_start), false});
    const size_t bad = utf8_maximal_subpart(text, pos);
    cur.push_back({text.substr(pos, bad), true});
    pos += bad;
    run_start = pos;
  }
  if (run_start < text.size()) cur.push_back({text.substr(run_start), false});

  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create(max_ovector_pairs_, nullptr));
  if (!md) fail(ErrorCode::kResourceExhausted, "pre-tokenizer '{}': cannot allocate PCRE2 match data", name_);

  for (size_t r = 0; r < regexes_.size(); ++r) {
    const Regex& regex = *regexes_[r];
    next.clear();
    next.reserve(cur.size() * 2);
    for (const Piece& piece : cur) {
      if (piece.frozen) {
        next.push_back(piece);
        continue;
      }
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.text.data());
      const size_t size = piece.text.size();
      size_t last = 0;
      size_t start = 0;
      while (start < size) {
        int rc = regex.jit ? pcre2_jit_match(regex.code, subject, size, start, 0, md.get(), nullptr)
                           : pcre2_match(regex.code, subject, size, start, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH && regex.jit) {
          // The JIT ran out of stack on a pathological piece: the interpreter keeps going.
          rc = pcre2_match(regex.code, subject, size, start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md.get(), nullptr);
        }
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          fail(ErrorCode::kResourceExhausted, "pre-tokenizer '{}': regex {} failed on a piece of {} bytes: {}", name_,
               r, size, pcre2_error_message(rc));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
        const size_t match_start = ov[0];
        const size_t match_end = ov[1];
        if (match_end <= match_start) {  // empty match: step over one character
          start = match_start + utf8_maximal_subpart(piece.text, match_start);
          continue;
        }
        if (match_start > last) next.push_back({piece.text.substr(last, match_start - last), false});
        next.push_back({piece.text.substr(match_start, match_end - match_start), false});
        last = start = match_end;
      }
      if (last < size) next.push_back({piece.text.substr(last), false});
    }
    cur.swap(next);
  }
  out.reserve(out.size() + cur.size());
  for (const Piece& piece : cur) out.push_back(piece.text);
}

}  // namespace duet
