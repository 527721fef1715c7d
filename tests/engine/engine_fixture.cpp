#include "engine_fixture.h"

#include <thread>
#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "duet/core/log.h"
#include "duet/core/random.h"
#include "duet/formats/gguf_writer.h"
#include "duet/model/synthetic.h"
#include "duet/tokenizer/bpe_trainer.h"

namespace duet::testing {

namespace {

// Writes `spec` in `type` with the 384-token tokenizer to a per-process temporary file (the model
// has `num_vocab` rows of logits).
std::string write_tiny(const std::string& tag, SyntheticSpec spec, DType type, int64_t num_vocab = 384) {
  const std::string p = (std::filesystem::temp_directory_path() /
                         ("duet_engine_test_" + tag + "_" + std::to_string(::getpid()) + ".gguf")).string();
  spec.num_vocab = num_vocab;
  ThreadPool pool(1);
  GgufWriter w;
  add_synthetic_model(w, spec, type, 7, pool);
  for (auto& [key, value] : tokenizer_metadata(train_bpe(builtin_corpus(), 384, "deepseek-coder"), "deepseek-coder")) {
    w.set(key, std::move(value));
  }
  w.write(p);
  spdlog::set_level(spdlog::level::warn);
  return p;
}

}  // namespace

// A model file written on first use and removed at exit (by the destructor of the object that
// holds its path: an atexit handler reading the path would run after that object is gone).
struct TempModel {
  std::string path;
  ~TempModel() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
};

const std::string& tiny_model_path() {
  static const TempModel model{write_tiny("llama", synthetic_preset("tiny"), DType::kF32)};
  return model.path;
}

const std::string& padded_vocab_model_path() {
  static const TempModel model{write_tiny("padded", synthetic_preset("tiny"), DType::kF32, 400)};
  return model.path;
}

const std::string& tiny_moe_model_path() {
  static const TempModel model{write_tiny("deepseek2", synthetic_preset("deepseek2-tiny-v3"), DType::kQ8_0)};
  return model.path;
}

const std::string& tiny_sparse_model_path() {
  SyntheticSpec spec = synthetic_preset("deepseek32-tiny");
  spec.index_topk = 6;  // most of the 16 prompts and every generated token past it
  static const TempModel model{write_tiny("deepseek32", spec, DType::kQ8_0)};
  return model.path;
}

const std::string& tiny_mtp_model_path() {
  SyntheticSpec spec = synthetic_preset("deepseek2-tiny-v3");
  spec.num_nextn_layers = 1;
  static const TempModel model{write_tiny("deepseek2-mtp", spec, DType::kQ8_0)};
  return model.path;
}

std::map<std::string, Finished> run_to_completion(LLMEngine& engine, int max_steps) {
  std::map<std::string, Finished> done;
  for (int step = 0; engine.has_unfinished() && step < max_steps; ++step) {
    // New requests held by a batching window: nothing to step until it closes.
    if (const auto until = engine.batch_wait_deadline()) std::this_thread::sleep_until(*until);
    for (RequestOutput& o : engine.step()) {
      Finished& f = done[o.request_id];
      if (!o.error.empty()) f.error = o.error;
      for (CompletionDelta& d : o.outputs) {
        if (f.outputs.size() <= static_cast<size_t>(d.index)) f.outputs.resize(static_cast<size_t>(d.index) + 1);
        CompletionDelta& acc = f.outputs[static_cast<size_t>(d.index)];
        acc.index = d.index;
        acc.text += d.text;
        acc.token_ids.insert(acc.token_ids.end(), d.token_ids.begin(), d.token_ids.end());
        acc.logprobs.insert(acc.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
        acc.cumulative_logprob = d.cumulative_logprob;
        if (d.finish_reason) {
          acc.finish_reason = d.finish_reason;
          acc.stop_reason = d.stop_reason;
        }
      }
      if (o.has_prompt_logprobs) {
        f.prompt_logprobs = o.prompt_logprobs;
        ++f.prompt_logprob_outputs;
      }
      if (o.finished) f.saw_finish = true;
    }
  }
  return done;
}

EngineConfig small_config(int64_t kv_tokens) {
  EngineConfig c;
  c.threads = 1;
  c.block_size = 4;
  c.kv_cache_tokens = kv_tokens;
  return c;
}

// 16 prompts of 1 to 50 tokens; the first six share a 17-token prefix, so prefix caching hits.
std::vector<std::vector<int32_t>> sixteen_prompts() {
  Rng rng(1234);
  auto random_ids = [&](size_t n) {
    std::vector<int32_t> ids(n);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng.next() % 380);
    return ids;
  };
  const std::vector<int32_t> shared = random_ids(17);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 16; ++i) {
    const size_t len = 1 + (static_cast<size_t>(i) * 7 + 3) % 50;
    std::vector<int32_t> p = i < 6 ? shared : std::vector<int32_t>{};
    const std::vector<int32_t> tail = random_ids(len);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
  }
  return prompts;
}

SamplingParams greedy(int32_t max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.ignore_eos = true;
  p.max_tokens = max_tokens;
  return p;
}

std::string id_of(size_t i) { return "r" + std::to_string(i); }

void expect_all_blocks_free(const LLMEngine& e) {
  const KvCacheStats s = e.kv_cache().stats();
  EXPECT_EQ(s.num_used_blocks, 0);
  EXPECT_EQ(e.kv_cache().num_free_blocks(), s.num_blocks);
}

void expect_batched_equals_one_at_a_time(const std::string& model, const std::function<EngineConfig(EngineConfig)>& place,
                                         bool place_reference) {
  const auto make_engine = [&](const EngineConfig& c) {
    return std::make_unique<LLMEngine>(std::make_shared<const GgufFile>(GgufFile::open(model)), c);
  };
  const std::vector<std::vector<int32_t>> prompts = sixteen_prompts();
  // Reference: one request at a time, nothing cached.
  EngineConfig alone_config = small_config();
  alone_config.enable_prefix_caching = false;
  auto alone = make_engine(place_reference ? place(alone_config) : alone_config);
  std::vector<std::vector<int32_t>> expected;
  for (size_t i = 0; i < prompts.size(); ++i) {
    alone->add_request(id_of(i), prompts[i], greedy(12));
    auto done = run_to_completion(*alone);
    ASSERT_TRUE(done[id_of(i)].saw_finish);
    expected.push_back(done[id_of(i)].outputs.at(0).token_ids);
    ASSERT_EQ(expected.back().size(), 12u);
  }

  struct Variant {
    const char* name;
    EngineConfig config;
  };
  std::vector<Variant> variants;
  variants.push_back({"prefix caching on", small_config()});
  EngineConfig no_prefix = small_config();
  no_prefix.enable_prefix_caching = false;
  variants.push_back({"prefix caching off", no_prefix});
  EngineConfig chunked = small_config();
  chunked.scheduler.max_num_batched_tokens = 7;
  variants.push_back({"chunked prefill of 7 tokens", chunked});
  EngineConfig tight = small_config(40 * 4);  // 40 blocks of 4 tokens for 16 requests of up to 79
  variants.push_back({"tiny KV pool", tight});
  EngineConfig tight_chunked = tight;
  tight_chunked.scheduler.max_num_batched_tokens = 16;
  tight_chunked.enable_prefix_caching = false;
  variants.push_back({"tiny KV pool, chunked, no prefix caching", tight_chunked});

  for (const Variant& v : variants) {
    auto engine = make_engine(place(v.config));
    // The first request runs a step alone, so the others can find its prompt's blocks cached.
    engine->add_request(id_of(0), prompts[0], greedy(12));
    std::vector<int32_t> first_step;  // steps until its prompt is computed and one token is out
    while (first_step.empty()) {
      for (const RequestOutput& o : engine->step()) {
        for (const CompletionDelta& d : o.outputs) first_step.insert(first_step.end(), d.token_ids.begin(), d.token_ids.end());
      }
    }
    for (size_t i = 1; i < prompts.size(); ++i) engine->add_request(id_of(i), prompts[i], greedy(12));
    auto done = run_to_completion(*engine);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const Finished& f = done[id_of(i)];
      ASSERT_TRUE(f.saw_finish) << v.name << " request " << i;
      ASSERT_EQ(f.outputs.size(), 1u);
      std::vector<int32_t> tokens = i == 0 ? first_step : std::vector<int32_t>{};
      tokens.insert(tokens.end(), f.outputs[0].token_ids.begin(), f.outputs[0].token_ids.end());
      EXPECT_EQ(tokens, expected[i]) << v.name << " request " << i;
      EXPECT_EQ(f.outputs[0].finish_reason, FinishReason::kLength);
    }
    const EngineMetrics m = engine->metrics();
    if (v.config.enable_prefix_caching) {
      EXPECT_GT(m.prefix_cache_hits_total, 0) << v.name;
    } else {
      EXPECT_EQ(m.prefix_cache_hits_total, 0) << v.name;
    }
    if (v.config.kv_cache_tokens == 40 * 4) {
      EXPECT_GT(m.preemptions_total, 0) << v.name;
    }
    expect_all_blocks_free(*engine);
  }
}

}  // namespace duet::testing
