// `duet kl-divergence BASE QUANT [--text-file FILE]`: what quantizing cost, measured the way
// llama-perplexity's --kl-divergence does: both models run over the same tokens, and at every
// position the next-token distribution of QUANT is compared with BASE's: KL(P_base || P_quant),
// whether the most likely token is the same, and each model's perplexity on the text. The text is
// tokenized with BASE's tokenizer (both models must share the vocabulary) and run in sequences of
// --ctx tokens; without --text-file it is the second half of the built-in corpus (`duet quantize
// --type awq4` calibrates on its beginning). BASE keeps its KV cache in f32; QUANT in
// --kv-cache-dtype (f32 by default, so only the weights differ; `BASE BASE --kv-cache-dtype q8_0`
// measures what the cache type alone costs).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "duet/cli/commands.h"
#include "duet/cli/engine_options.h"
#include "duet/cli/loading.h"
#include "duet/cli/progress.h"
#include "duet/core/error.h"
#include "duet/tokenizer/bpe_trainer.h"

namespace duet::cli {
namespace {

struct KlOptions {
  std::string base;
  std::string quant;
  std::string text_file;
  int64_t max_tokens = 1024;
  int64_t ctx = 128;
  int threads = 0;
  PlacementOptions placement;
  bool json = false;
  KvDtype kv_dtype = KvDtype::kF32;
};

// log-softmax of one row of logits, in double.
void log_softmax(const float* logits, int64_t n, std::vector<double>& out) {
  out.resize(static_cast<size_t>(n));
  double max = logits[0];
  for (int64_t i = 1; i < n; ++i) max = std::max(max, static_cast<double>(logits[i]));
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  const double log_z = max + std::log(sum);
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = static_cast<double>(logits[i]) - log_z;
}

int64_t argmax(const float* x, int64_t n) { return std::max_element(x, x + n) - x; }

std::string default_text() {
  const std::string_view corpus = builtin_corpus();
  size_t start = corpus.size() / 2;
  const size_t newline = corpus.find('\n', start);
  if (newline != std::string_view::npos) start = newline + 1;
  return std::string(corpus.substr(start));
}

int run_kl_divergence(const KlOptions& o) {
  if (o.ctx < 2) fail(ErrorCode::kInvalidArgument, "--ctx is {}, expected at least 2", o.ctx);
  if (o.max_tokens < 2) fail(ErrorCode::kInvalidArgument, "--max-tokens is {}, expected at least 2", o.max_tokens);
  std::string text;
  if (o.text_file.empty()) {
    text = default_text();
  } else {
    std::ifstream in(o.text_file, std::ios::binary);
    if (!in) fail(ErrorCode::kNotFound, "cannot open text file '{}'", o.text_file);
    std::ostringstream s;
    s << in.rdbuf();
    text = s.str();
  }
  LoadedModel base = load_model_file(o.base, o.threads, true, o.placement.spec(), o.kv_dtype);
  LoadedModel quant = load_model_file(o.quant, o.threads, false, o.placement.spec(), o.kv_dtype);
  const int64_t vocab = base.model->config().num_vocab;
  if (quant.model->config().num_vocab != vocab) {
    fail(ErrorCode::kInvalidArgument, "'{}' has {} tokens in its vocabulary, '{}' has {}: they cannot be compared", o.base,
         vocab, o.quant, quant.model->config().num_vocab);
  }
  std::vector<int32_t> ids = base.tokenizer->encode(text, true, false);
  if (static_cast<int64_t>(ids.size()) > o.max_tokens) ids.resize(static_cast<size_t>(o.max_tokens));
  if (ids.size() < 2) fail(ErrorCode::kInvalidArgument, "the text gives {} token(s), expected at least 2", ids.size());
  const int64_t ctx = std::min<int64_t>({o.ctx, base.model->config().context_length, quant.model->config().context_length});

  SequenceRunner base_runner(*base.model, ctx, 16, KvDtype::kF32), quant_runner(*quant.model, ctx, 16, o.kv_dtype);
  std::vector<float> base_logits(static_cast<size_t>(ctx * vocab)), quant_logits(static_cast<size_t>(ctx * vocab));
  std::vector<double> lp, lq, kls;
  int64_t same_top = 0, num_predicted = 0;
  double nll_base = 0.0, nll_quant = 0.0;
  Progress progress(fmt::format("comparing on {} tokens", ids.size()));
  for (size_t begin = 0; begin < ids.size(); begin += static_cast<size_t>(ctx)) {
    const size_t len = std::min(ids.size() - begin, static_cast<size_t>(ctx));
    const std::span<const int32_t> chunk(ids.data() + begin, len);
    base_runner.forward(chunk, 0, base_logits.data(), true);
    quant_runner.forward(chunk, 0, quant_logits.data(), true);
    for (size_t i = 0; i < len; ++i) {
      const float* pb = base_logits.data() + static_cast<int64_t>(i) * vocab;
      const float* pq = quant_logits.data() + static_cast<int64_t>(i) * vocab;
      log_softmax(pb, vocab, lp);
      log_softmax(pq, vocab, lq);
      double kl = 0.0;
      for (size_t t = 0; t < lp.size(); ++t) kl += std::exp(lp[t]) * (lp[t] - lq[t]);
      kls.push_back(std::max(kl, 0.0));
      same_top += argmax(pb, vocab) == argmax(pq, vocab) ? 1 : 0;
      if (i + 1 < len) {
        nll_base -= lp[static_cast<size_t>(chunk[i + 1])];
        nll_quant -= lq[static_cast<size_t>(chunk[i + 1])];
        ++num_predicted;
      }
    }
    progress.update(begin + len, ids.size());
  }
  progress.finish();

  const double n = static_cast<double>(kls.size());
  double mean = 0.0;
  for (double k : kls) mean += k;
  mean /= n;
  double var = 0.0;
  for (double k : kls) var += (k - mean) * (k - mean);
  const double stderr_mean = kls.size() > 1 ? std::sqrt(var / (n - 1.0) / n) : 0.0;
  std::vector<double> sorted = kls;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  const double p99 = sorted[std::min(sorted.size() - 1, static_cast<size_t>(0.99 * n))];
  const double top1 = static_cast<double>(same_top) / n;
  const double ppl_base = std::exp(nll_base / static_cast<double>(std::max<int64_t>(num_predicted, 1)));
  const double ppl_quant = std::exp(nll_quant / static_cast<double>(std::max<int64_t>(num_predicted, 1)));
  if (o.json) {
    fmt::print("{{\"tokens\": {}, \"ctx\": {}, \"kl_mean\": {:.6g}, \"kl_stderr\": {:.3g}, \"kl_median\": {:.6g}, "
               "\"kl_p99\": {:.6g}, \"kl_max\": {:.6g}, \"top1_agreement\": {:.6f}, \"ppl_base\": {:.6g}, "
               "\"ppl_quant\": {:.6g}}}\n",
               kls.size(), ctx, mean, stderr_mean, median, p99, sorted.back(), top1, ppl_base, ppl_quant);
  } else {
    fmt::print("tokens: {} (sequences of up to {})\n", kls.size(), ctx);
    fmt::print("mean KL divergence: {:.6f} ± {:.6f}\n", mean, stderr_mean);
    fmt::print("median KL divergence: {:.6f}, 99th percentile {:.6f}, max {:.6f}\n", median, p99, sorted.back());
    fmt::print("top-1 agreement: {:.2f}%\n", 100.0 * top1);
    fmt::print("perplexity: base {:.4f}, quantized {:.4f}\n", ppl_base, ppl_quant);
  }
  return 0;
}

}  // namespace

void add_kl_divergence_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("kl-divergence",
                                 "Compare a quantized model's next-token distributions with the unquantized model's");
  auto o = std::make_shared<KlOptions>();
  cmd->add_option("base", o->base, "The unquantized model (GGUF file or Hugging Face folder)")->required();
  cmd->add_option("quant", o->quant, "The quantized model, same vocabulary")->required();
  cmd->add_option("--text-file", o->text_file, "Plain text to run (default: the second half of the built-in corpus)");
  cmd->add_option("--max-tokens", o->max_tokens, "Tokens of the text to use")->capture_default_str();
  cmd->add_option("--ctx", o->ctx, "Tokens per sequence")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Threads of the cpu device (default: all)");
  add_placement_options(cmd, o->placement);
  cmd->add_flag("--json", o->json, "Print one JSON object");
  add_kv_dtype_option(cmd, o->kv_dtype);
  cmd->callback([o, &exit_code] { exit_code = run_kl_divergence(*o); });
}

}  // namespace duet::cli
