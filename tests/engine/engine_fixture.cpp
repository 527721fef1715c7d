#include "engine_fixture.h"

#include <thread>
#include <unistd.h>

#include <filesystem>

#include "duet/core/log.h"
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

}  // namespace duet::testing
