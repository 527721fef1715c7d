// Hugging Face folders read as GGUF (hf_folder.h, hf_config.h, open_model_path): the translated
// keys and tensors of small folders written here, and a clear error for each way a folder can be
// wrong: missing config keys, an unknown architecture, settings duet does not implement, missing
// or unexpected tensors, a shard the index lists but the folder lacks, FP8 and AWQ weights.
// (The same logits as from GGUF are checked on whole models by tests/reference/test_hf_folder.py.)
#include <cmath>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "duet/backend/backend.h"
#include "duet/core/error.h"
#include "duet/engine/generation_config.h"
#include "duet/engine/model_path.h"
#include "duet/formats/hf_folder.h"
#include "duet/model/model.h"
#include "duet/tokenizer/tokenizer.h"
#include "safetensors_fixture.h"

namespace duet::testing {
namespace {

using Json = nlohmann::json;

constexpr int64_t kHidden = 8, kHeads = 2, kKvHeads = 1, kFf = 16, kVocab = 16;

Json llama_config() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"hidden_size", kHidden},
          {"intermediate_size", kFf},
          {"num_hidden_layers", 1},
          {"num_attention_heads", kHeads},
          {"num_key_value_heads", kKvHeads},
          {"max_position_embeddings", 64},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 500000.0},
          {"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}},
          {"vocab_size", kVocab},
          {"tie_word_embeddings", false},
          {"torch_dtype", "float32"}};
}

std::vector<StTensor> llama_tensors() {
  const int64_t kv = kKvHeads * kHidden / kHeads;
  auto t = [](const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return StTensor{name, "F32", shape, f32_bytes(n, static_cast<float>(name.size()))};
  };
  const std::string p = "model.layers.0.";
  return {t("model.embed_tokens.weight", {kVocab, kHidden}),
          t(p + "input_layernorm.weight", {kHidden}),
          t(p + "self_attn.q_proj.weight", {kHidden, kHidden}),
          t(p + "self_attn.k_proj.weight", {kv, kHidden}),
          t(p + "self_attn.v_proj.weight", {kv, kHidden}),
          t(p + "self_attn.o_proj.weight", {kHidden, kHidden}),
          t(p + "self_attn.rotary_emb.inv_freq", {kHidden / kHeads / 2}),
          t(p + "post_attention_layernorm.weight", {kHidden}),
          t(p + "mlp.gate_proj.weight", {kFf, kHidden}),
          t(p + "mlp.up_proj.weight", {kFf, kHidden}),
          t(p + "mlp.down_proj.weight", {kHidden, kFf}),
          t("model.norm.weight", {kHidden}),
          t("lm_head.weight", {kVocab, kHidden})};
}

class HfFolderTest : public ::testing::Test {
 protected:
  std::string dir() const { return dir_.path(""); }
  void config(const Json& c) { write_text(dir_.path("config.json"), c.dump()); }
  void weights(const std::vector<StTensor>& t, const std::string& file = "model.safetensors") {
    write_bytes(dir_.path(file), safetensors_bytes(t));
  }
  // The Error that opening the folder (and, with `load`, building the model) throws; "" if none.
  std::string error(ErrorCode* code = nullptr, bool load = false) const {
    try {
      auto file = std::make_shared<const GgufFile>(open_model_path(dir()));
      if (load) {
        std::unique_ptr<Backend> backend = make_cpu_backend(1);
        load_model(file, *backend);
      }
    } catch (const Error& e) {
      if (code) *code = e.code();
      return e.what();
    }
    return "";
  }

  TempFolder dir_{"hf-folder-test"};
};

TEST_F(HfFolderTest, LlamaFolderReadsAsGguf) {
  config(llama_config());
  const std::vector<StTensor> tensors = llama_tensors();
  weights(tensors);
  write_text(dir_.path("generation_config.json"),
             Json{{"temperature", 0.6}, {"top_p", 0.95}, {"eos_token_id", {1, 7}}, {"bos_token_id", 0}}.dump());
  EXPECT_TRUE(is_hf_folder(dir()));
  auto f = std::make_shared<const GgufFile>(open_model_path(dir()));
  EXPECT_TRUE(f->assembled());
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("llama.embedding_length"), kHidden);
  EXPECT_EQ(f->get_int("llama.attention.head_count_kv"), kKvHeads);
  EXPECT_EQ(f->get_int("llama.rope.dimension_count"), kHidden / kHeads);
  EXPECT_FLOAT_EQ(static_cast<float>(f->get_float("llama.rope.freq_base")), 500000.0f);
  EXPECT_FLOAT_EQ(static_cast<float>(f->get_float("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
  EXPECT_EQ(f->get_string("llama.rope.scaling.type"), "linear");
  EXPECT_FLOAT_EQ(static_cast<float>(f->get_float("llama.rope.scaling.factor")), 2.0f);
  EXPECT_EQ(f->get_string("duet.rope.layout"), "neox");
  EXPECT_EQ(f->get_int("general.file_type"), 0);
  EXPECT_EQ(f->get_int("duet.hf.num_shards"), 1);
  EXPECT_FLOAT_EQ(static_cast<float>(f->get_float("duet.generation.temperature")), 0.6f);
  EXPECT_EQ(f->get_int_array("duet.generation.eos_token_ids"), (std::vector<int32_t>{1, 7}));
  EXPECT_FALSE(f->has("duet.hf.mtp_layers_skipped"));
  // Renamed, shapes reversed, the bytes in place; inv_freq skipped.
  ASSERT_EQ(f->tensors().size(), tensors.size() - 1);
  EXPECT_EQ(f->tensors().front().name, "token_embd.weight");
  const GgufTensorInfo* k = f->find_tensor("blk.0.attn_k.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->shape, (std::vector<int64_t>{kHidden, kKvHeads * kHidden / kHeads}));
  EXPECT_EQ(k->type, DType::kF32);
  const std::vector<uint8_t>& want = tensors[3].data;
  EXPECT_EQ(std::vector<uint8_t>(k->data, k->data + k->nbytes), want);
  for (const char* name : {"output.weight", "output_norm.weight", "blk.0.ffn_down.weight", "blk.0.attn_norm.weight"}) {
    EXPECT_NE(f->find_tensor(name), nullptr) << name;
  }
  // It loads as a model, with Hugging Face's rope layout.
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  const std::unique_ptr<Model> model = load_model(f, *backend);
  EXPECT_EQ(model->config().rope.mode, RopeMode::kNeox);
  EXPECT_EQ(model->config().num_vocab, kVocab);
  EXPECT_FALSE(model->config().tied_embeddings);
}

// Llama 3's rope scaling (R1-Distill-Llama) becomes GGUF's rope_freqs.weight: a divisor per
// rotated pair, 1 for fast pairs, the factor for slow ones, a blend between; the model uses it.
TEST_F(HfFolderTest, Llama3RopeScalingBecomesFrequencyDivisors) {
  Json c = llama_config();
  c["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 32}};
  config(c);
  weights(llama_tensors());
  auto f = std::make_shared<const GgufFile>(open_model_path(dir()));
  EXPECT_FALSE(f->has("llama.rope.scaling.type"));
  const GgufTensorInfo* t = f->find_tensor("rope_freqs.weight");
  ASSERT_NE(t, nullptr);
  const int64_t head_dim = kHidden / kHeads, half = head_dim / 2;
  ASSERT_EQ(t->shape, (std::vector<int64_t>{half}));
  const auto* got = reinterpret_cast<const float*>(t->data);
  for (int64_t i = 0; i < half; ++i) {
    // Wavelength 2 pi / theta^(-2i/d) against the original context's 32 / 4 and 32 / 1.
    const double wavelen = 2.0 * 3.14159265358979 * std::pow(500000.0, 2.0 * static_cast<double>(i) / head_dim);
    double want = 1.0;
    if (wavelen > 32.0) {
      want = 8.0;
    } else if (wavelen >= 8.0) {
      const double smooth = (32.0 / wavelen - 1.0) / 3.0;
      want = 1.0 / ((1.0 - smooth) / 8.0 + smooth);
    }
    EXPECT_NEAR(got[i], want, 1e-6 * want) << i;
  }
  EXPECT_EQ(got[0], 1.0f);        // wavelength 2 pi: fast
  EXPECT_EQ(got[half - 1], 8.0f);  // the slowest pair
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  const std::unique_ptr<Model> model = load_model(f, *backend);
  ASSERT_EQ(model->config().rope.freq_factors.size(), static_cast<size_t>(half));
  EXPECT_EQ(model->config().rope.freq_factors[half - 1], 8.0f);
}

TEST_F(HfFolderTest, ShardedFolders) {
  config(llama_config());
  std::vector<StTensor> tensors = llama_tensors();
  std::vector<StTensor> a(tensors.begin(), tensors.begin() + 5), b(tensors.begin() + 5, tensors.end());
  weights(a, "model-00001-of-00002.safetensors");
  weights(b, "model-00002-of-00002.safetensors");
  Json map = Json::object();
  for (const StTensor& t : a) map[t.name] = "model-00001-of-00002.safetensors";
  for (const StTensor& t : b) map[t.name] = "model-00002-of-00002.safetensors";
  write_text(dir_.path("model.safetensors.index.json"), Json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump());
  EXPECT_EQ(error(nullptr, true), "");
  EXPECT_EQ(open_model_path(dir()).get_int("duet.hf.num_shards"), 2);

  // A shard the index lists but the folder lacks.
  std::filesystem::remove(dir_.path("model-00002-of-00002.safetensors"));
  ErrorCode code{};
  std::string e = error(&code);
  EXPECT_EQ(code, ErrorCode::kNotFound);
  EXPECT_NE(e.find("model-00002-of-00002.safetensors' does not exist"), std::string::npos) << e;
  EXPECT_NE(e.find("model.safetensors.index.json"), std::string::npos) << e;

  // The index names a tensor its shard does not hold.
  weights(b, "model-00002-of-00002.safetensors");
  map["model.layers.0.extra.weight"] = "model-00002-of-00002.safetensors";
  write_text(dir_.path("model.safetensors.index.json"), Json{{"weight_map", map}}.dump());
  e = error(&code);
  EXPECT_EQ(code, ErrorCode::kDataLoss);
  EXPECT_NE(e.find("tensor 'model.layers.0.extra.weight' is not in it"), std::string::npos) << e;

  write_text(dir_.path("model.safetensors.index.json"), "{\"weight_map\": [}");
  e = error(&code);
  EXPECT_EQ(code, ErrorCode::kDataLoss);
  EXPECT_NE(e.find("model.safetensors.index.json"), std::string::npos) << e;
}

TEST_F(HfFolderTest, ConfigErrorsNameTheKey) {
  weights(llama_tensors());
  auto expect = [&](const Json& c, const std::string& part, ErrorCode want) {
    config(c);
    ErrorCode code{};
    const std::string e = error(&code);
    EXPECT_NE(e.find(part), std::string::npos) << "expected '" << part << "' in: " << e;
    EXPECT_EQ(code, want) << e;
    EXPECT_NE(e.find("config.json"), std::string::npos) << e;
  };
  Json c = llama_config();
  c.erase("num_hidden_layers");
  expect(c, "'num_hidden_layers' is missing", ErrorCode::kInvalidArgument);
  c = llama_config();
  c["hidden_size"] = "eight";
  expect(c, "'hidden_size' is \"eight\", expected an integer", ErrorCode::kInvalidArgument);
  c = llama_config();
  c["architectures"] = {"MistralForCausalLM"};
  expect(c, "architecture 'MistralForCausalLM' is not supported (supported: LlamaForCausalLM, Qwen2ForCausalLM, "
            "Qwen3ForCausalLM, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, DeepseekV32ForCausalLM)",
         ErrorCode::kUnsupported);
  c.erase("architectures");
  expect(c, "'architectures' is missing", ErrorCode::kInvalidArgument);
  c = llama_config();
  c["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 8.0}};
  expect(c, "rope scaling 'dynamic' is not implemented for llama (supported: linear, yarn, llama3)", ErrorCode::kUnsupported);
  c = llama_config();  // 2^32 + 8: counts are 32-bit in the model, so this is refused, not taken as 8
  c["hidden_size"] = (int64_t{1} << 32) + 8;
  expect(c, "'hidden_size' is 4294967304, expected a positive integer below 2^31", ErrorCode::kInvalidArgument);
  c = llama_config();
  c["hidden_act"] = "gelu";
  expect(c, "'hidden_act' is \"gelu\"", ErrorCode::kUnsupported);
  c = llama_config();
  c["attention_bias"] = true;
  expect(c, "'attention_bias' is true", ErrorCode::kUnsupported);
  write_text(dir_.path("config.json"), "{\"architectures\": [\"LlamaForCausalLM\"],");
  ErrorCode code{};
  EXPECT_NE(error(&code).find("does not parse"), std::string::npos);
  EXPECT_EQ(code, ErrorCode::kDataLoss);
}

TEST_F(HfFolderTest, TensorProblemsAreListed) {
  config(llama_config());
  std::vector<StTensor> tensors = llama_tensors();
  // A missing projection is the model's to notice, with every other problem.
  tensors.erase(tensors.begin() + 2);  // q_proj
  weights(tensors);
  ErrorCode code{};
  std::string e = error(&code, true);
  EXPECT_EQ(code, ErrorCode::kInvalidArgument);
  EXPECT_NE(e.find("tensor 'blk.0.attn_q.weight' is missing"), std::string::npos) << e;
  EXPECT_NE(e.find("model.layers.N.self_attn.q_proj.weight is blk.N.attn_q.weight"), std::string::npos) << e;

  // lm_head is required unless tie_word_embeddings.
  tensors = llama_tensors();
  tensors.pop_back();
  weights(tensors);
  e = error(&code);
  EXPECT_NE(e.find("'lm_head.weight' is missing"), std::string::npos) << e;
  Json c = llama_config();
  c["tie_word_embeddings"] = true;
  config(c);
  EXPECT_EQ(error(nullptr, true), "");
  EXPECT_EQ(open_model_path(dir()).find_tensor("output.weight"), nullptr);

  // A tensor the architecture has no place for (qwen3's q norm in a llama folder).
  config(llama_config());
  tensors = llama_tensors();
  tensors.push_back({"model.layers.0.self_attn.q_norm.weight", "F32", {4}, f32_bytes(4)});
  weights(tensors);
  e = error(&code);
  EXPECT_EQ(code, ErrorCode::kInvalidArgument);
  EXPECT_NE(e.find("LlamaForCausalLM (llama) has no place for: model.layers.0.self_attn.q_norm.weight"), std::string::npos) << e;

  // FP8 weights and AWQ's int4 without a quantization_config that declares them are named.
  tensors = llama_tensors();
  tensors[2] = {"model.layers.0.self_attn.q_proj.weight", "F8_E4M3", {kHidden, kHidden}, std::vector<uint8_t>(kHidden * kHidden)};
  std::stable_sort(tensors.begin(), tensors.end(),
                   [](const StTensor& x, const StTensor& y) { return st_dtype_size(x.dtype) > st_dtype_size(y.dtype); });
  weights(tensors);
  e = error(&code);
  EXPECT_EQ(code, ErrorCode::kUnsupported);
  EXPECT_NE(e.find("tensor 'model.layers.0.self_attn.q_proj.weight' in model.safetensors is F8_E4M3"), std::string::npos) << e;
  EXPECT_NE(e.find("when config.json's quantization_config declares them"), std::string::npos) << e;
  // Declared as FP8, but the block scales are missing.
  Json fp8 = llama_config();
  fp8["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}};
  config(fp8);
  e = error(&code);
  EXPECT_NE(e.find("tensor 'model.layers.0.self_attn.q_proj.weight_scale_inv' (for 'model.layers.0.self_attn.q_proj.weight'"
                   " in model.safetensors) is missing"), std::string::npos) << e;
  fp8["quantization_config"]["weight_block_size"] = {128, 64};
  config(fp8);
  e = error(&code);
  EXPECT_EQ(code, ErrorCode::kUnsupported);
  EXPECT_NE(e.find("square weight_block_size"), std::string::npos) << e;
  Json gptq = llama_config();
  gptq["quantization_config"] = {{"quant_method", "gptq"}};
  config(gptq);
  e = error(&code);
  EXPECT_EQ(code, ErrorCode::kUnsupported);
  EXPECT_NE(e.find("quant_method 'gptq' is not read"), std::string::npos) << e;
  config(llama_config());
  tensors = llama_tensors();
  tensors[2] = {"model.layers.0.self_attn.q_proj.qweight", "I32", {kHidden, 1}, std::vector<uint8_t>(kHidden * 4)};
  tensors.push_back({"model.layers.0.self_attn.q_proj.scales", "F16", {1, kHidden}, std::vector<uint8_t>(kHidden * 2)});
  weights(tensors);
  e = error(&code);
  EXPECT_EQ(code, ErrorCode::kUnsupported);
  EXPECT_NE(e.find("quantized weights (model.layers.0.self_attn.q_proj.qweight"), std::string::npos) << e;
  // Declared as AWQ, but qzeros is missing.
  Json awq = llama_config();
  awq["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}, {"group_size", 32}, {"zero_point", true},
                                {"version", "gemm"}};
  config(awq);
  e = error(&code);
  EXPECT_NE(e.find("tensor 'model.layers.0.self_attn.q_proj.qzeros' (for 'model.layers.0.self_attn.q_proj.qweight'"),
            std::string::npos) << e;
  config(llama_config());

  // No weights at all.
  std::filesystem::remove(dir_.path("model.safetensors"));
  e = error(&code);
  EXPECT_EQ(code, ErrorCode::kNotFound);
  EXPECT_NE(e.find("neither model.safetensors.index.json nor model.safetensors"), std::string::npos) << e;
}

Json deepseek_config() {
  return {{"architectures", {"DeepseekV3ForCausalLM"}},
          {"hidden_size", 8},
          {"intermediate_size", 16},
          {"moe_intermediate_size", 4},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 2},
          {"max_position_embeddings", 4096},
          {"q_lora_rank", nullptr},
          {"kv_lora_rank", 4},
          {"qk_nope_head_dim", 4},
          {"qk_rope_head_dim", 2},
          {"v_head_dim", 4},
          {"n_routed_experts", 3},
          {"n_shared_experts", 1},
          {"num_experts_per_tok", 2},
          {"first_k_dense_replace", 1},
          {"moe_layer_freq", 1},
          {"n_group", 1},
          {"topk_group", 1},
          {"norm_topk_prob", true},
          {"routed_scaling_factor", 2.5},
          {"scoring_func", "sigmoid"},
          {"topk_method", "noaux_tc"},
          {"num_nextn_predict_layers", 1},
          {"rope_scaling",
           {{"type", "yarn"}, {"factor", 40}, {"original_max_position_embeddings", 4096}, {"beta_fast", 32},
            {"beta_slow", 1}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}}},
          {"vocab_size", 16}};
}

// DeepSeek-V3.2: V3's keys under deepseek32, the indexer's from index_* (Hugging Face's defaults
// when absent), its tensors under self_attn.indexer; a q_lora_rank is required, and another
// architecture's folder holding indexer tensors is refused.
TEST_F(HfFolderTest, DeepseekV32IndexerKeysAndTensors) {
  Json c = deepseek_config();
  c["architectures"] = {"DeepseekV32ForCausalLM"};
  c["q_lora_rank"] = 4;
  c["index_topk"] = 16;
  config(c);
  const std::vector<StTensor> indexer = {
      {"model.layers.0.self_attn.indexer.wq_b.weight", "F32", {8, 4}, f32_bytes(32)},
      {"model.layers.0.self_attn.indexer.wk.weight", "F32", {4, 8}, f32_bytes(32)},
      {"model.layers.0.self_attn.indexer.k_norm.weight", "F32", {4}, f32_bytes(4)},
      {"model.layers.0.self_attn.indexer.k_norm.bias", "F32", {4}, f32_bytes(4)},
      {"model.layers.0.self_attn.indexer.weights_proj.weight", "F32", {2, 8}, f32_bytes(16)},
      {"lm_head.weight", "F32", {16, 8}, f32_bytes(128)}};
  weights(indexer);
  const GgufFile f = open_model_path(dir());
  EXPECT_EQ(f.get_string("general.architecture"), "deepseek32");
  EXPECT_EQ(f.get_int("deepseek32.attention.q_lora_rank"), 4);
  EXPECT_EQ(f.get_int("deepseek32.attention.kv_lora_rank"), 4);
  EXPECT_EQ(f.get_int("deepseek32.attention.indexer.head_count"), 64);
  EXPECT_EQ(f.get_int("deepseek32.attention.indexer.key_length"), 128);
  EXPECT_EQ(f.get_int("deepseek32.attention.indexer.top_k"), 16);
  EXPECT_EQ(f.get_int("deepseek32.expert_gating_func"), 2);
  for (const char* name : {"blk.0.indexer.attn_q_b.weight", "blk.0.indexer.attn_k.weight", "blk.0.indexer.k_norm.weight",
                           "blk.0.indexer.k_norm.bias", "blk.0.indexer.proj.weight"}) {
    EXPECT_NE(f.find_tensor(name), nullptr) << name;
  }
  EXPECT_EQ(f.find_tensor("blk.0.indexer.attn_q_b.weight")->shape, (std::vector<int64_t>{4, 8}));

  c["q_lora_rank"] = nullptr;
  config(c);
  std::string e = error();
  EXPECT_NE(e.find("q_lora_rank"), std::string::npos) << e;
  EXPECT_NE(e.find("the indexer reads the low-rank query"), std::string::npos) << e;
  config(deepseek_config());  // V3 with V3.2's tensors
  e = error();
  EXPECT_NE(e.find("model.layers.0.self_attn.indexer.wq_b.weight"), std::string::npos) << e;
}

TEST_F(HfFolderTest, DeepseekKeysExpertsAndMtpLayers) {
  config(deepseek_config());
  std::vector<StTensor> tensors;
  for (int e = 0; e < 3; ++e) {
    for (const char* kind : {"gate_proj", "up_proj", "down_proj"}) {
      const std::vector<int64_t> shape = std::string(kind) == "down_proj" ? std::vector<int64_t>{8, 4} : std::vector<int64_t>{4, 8};
      tensors.push_back({fmt::format("model.layers.1.mlp.experts.{}.{}.weight", e, kind), "F32", shape,
                         f32_bytes(32, static_cast<float>(e * 100))});
    }
  }
  tensors.push_back({"model.layers.1.mlp.gate.e_score_correction_bias", "F32", {3}, f32_bytes(3)});
  tensors.push_back({"model.layers.2.eh_proj.weight", "F32", {8, 16}, f32_bytes(128)});  // MTP
  tensors.push_back({"model.layers.2.self_attn.kv_b_proj.weight", "F32", {4, 4}, f32_bytes(16)});
  tensors.push_back({"lm_head.weight", "F32", {16, 8}, f32_bytes(128)});
  weights(tensors);
  const GgufFile f = open_model_path(dir());
  EXPECT_EQ(f.get_string("general.architecture"), "deepseek2");
  EXPECT_FALSE(f.has("deepseek2.attention.q_lora_rank"));
  EXPECT_EQ(f.get_int("deepseek2.attention.key_length"), 6);
  EXPECT_EQ(f.get_int("deepseek2.rope.dimension_count"), 2);
  EXPECT_EQ(f.get_int("deepseek2.expert_gating_func"), 2);
  EXPECT_EQ(f.get_int("deepseek2.expert_count"), 3);
  EXPECT_EQ(f.get_int("deepseek2.leading_dense_block_count"), 1);
  EXPECT_TRUE(f.get_bool_or("deepseek2.expert_weights_norm", false));
  EXPECT_FLOAT_EQ(static_cast<float>(f.get_float("deepseek2.expert_weights_scale")), 2.5f);
  EXPECT_EQ(f.get_string("deepseek2.rope.scaling.type"), "yarn");
  EXPECT_FLOAT_EQ(static_cast<float>(f.get_float("deepseek2.rope.scaling.yarn_log_multiplier")), 0.1f);
  EXPECT_EQ(f.get_int("deepseek2.rope.scaling.original_context_length"), 4096);
  EXPECT_EQ(f.get_int("duet.hf.mtp_layers_skipped"), 1);
  EXPECT_FALSE(f.has("duet.rope.layout"));
  // Experts stacked: [cols, rows, experts], expert e's rows after expert e-1's.
  const GgufTensorInfo* up = f.find_tensor("blk.1.ffn_up_exps.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->shape, (std::vector<int64_t>{8, 4, 3}));
  for (int e = 0; e < 3; ++e) {
    const std::vector<uint8_t> want = f32_bytes(32, static_cast<float>(e * 100));
    EXPECT_EQ(std::vector<uint8_t>(up->data + e * 128, up->data + (e + 1) * 128), want) << e;
  }
  EXPECT_EQ(f.find_tensor("blk.1.ffn_down_exps.weight")->shape, (std::vector<int64_t>{4, 8, 3}));
  EXPECT_NE(f.find_tensor("blk.1.exp_probs_b.bias"), nullptr);
  EXPECT_EQ(f.find_tensor("blk.2.attn_kv_b.weight"), nullptr);

  // A missing expert, and an expert index past n_routed_experts.
  tensors.erase(tensors.begin() + 4);  // expert 1's up_proj
  tensors.push_back({"model.layers.1.mlp.experts.7.up_proj.weight", "F32", {4, 8}, f32_bytes(32)});
  weights(tensors);
  const std::string e = error();
  EXPECT_NE(e.find("1 of 3 experts of layer 1 are missing for 'blk.1.ffn_up_exps.weight' (experts 1)"), std::string::npos) << e;
  EXPECT_NE(e.find("is expert 7, but config.json has n_routed_experts 3"), std::string::npos) << e;

  // A config.json that claims far more experts than the folder holds: the count of the missing
  // ones, the first few named, without allocating or walking one slot per claimed expert (about
  // 2^31 of them took a minute).
  Json huge = deepseek_config();
  huge["n_routed_experts"] = INT32_MAX;
  config(huge);
  tensors.pop_back();
  weights(tensors);
  const std::string h = error();
  EXPECT_NE(h.find("2147483645 of 2147483647 experts of layer 1 are missing for 'blk.1.ffn_up_exps.weight' "
                   "(experts 1, 3, 4, 5, 6, 7, 8, 9, ...)"),
            std::string::npos)
      << h;
}

TEST_F(HfFolderTest, DeepseekSettingsDuetDoesNotImplement) {
  weights({{"lm_head.weight", "F32", {16, 8}, f32_bytes(128)}});
  auto expect = [&](Json c, const std::string& part) {
    config(c);
    ErrorCode code{};
    const std::string e = error(&code);
    EXPECT_NE(e.find(part), std::string::npos) << "expected '" << part << "' in: " << e;
    EXPECT_EQ(code, ErrorCode::kUnsupported) << e;
  };
  Json c = deepseek_config();
  c["topk_method"] = "group_limited_greedy";
  expect(c, "scoring_func 'sigmoid' with topk_method 'group_limited_greedy' is not implemented");
  c = deepseek_config();
  c["moe_layer_freq"] = 2;
  expect(c, "'moe_layer_freq' is 2");
  c = deepseek_config();
  c["rope_scaling"]["mscale"] = 0.707;
  expect(c, "mscale != mscale_all_dim");
  c = deepseek_config();
  c["rope_scaling"]["beta_fast"] = 16;
  expect(c, "beta_fast other than 32");
  // V2's greedy routing ignores n_group.
  c = deepseek_config();
  c["architectures"] = {"DeepseekV2ForCausalLM"};
  c["scoring_func"] = "softmax";
  c["topk_method"] = "greedy";
  c["n_group"] = 4;
  c["topk_group"] = 2;
  config(c);
  const GgufFile f = open_model_path(dir());
  EXPECT_EQ(f.get_int("deepseek2.expert_gating_func"), 1);
  EXPECT_EQ(f.get_int("deepseek2.expert_group_count"), 1);
  c["topk_method"] = "group_limited_greedy";
  config(c);
  EXPECT_EQ(open_model_path(dir()).get_int("deepseek2.expert_group_count"), 4);
}

TEST_F(HfFolderTest, Qwen2WindowFollowsHuggingFaceDefaults) {
  Json c = llama_config();
  c["architectures"] = {"Qwen2ForCausalLM"};
  c.erase("rope_scaling");
  c["sliding_window"] = 4096;
  c["max_window_layers"] = 21;
  c["tie_word_embeddings"] = true;
  config(c);
  weights({});
  GgufFile f = open_model_path(dir());
  EXPECT_EQ(f.get_int("qwen2.attention.sliding_window"), 4096);
  EXPECT_FALSE(f.get_bool_or("qwen2.attention.use_sliding_window", true));  // HF's default: off
  EXPECT_EQ(f.get_int("qwen2.attention.max_window_layers"), 21);
  EXPECT_FALSE(f.has("duet.rope.layout"));
  c["use_sliding_window"] = true;
  config(c);
  EXPECT_TRUE(open_model_path(dir()).get_bool_or("qwen2.attention.use_sliding_window", false));
}

// Qwen3: its own head size, q/k norms, YaRN. The rotary's magnitude factor as each config key
// means it: attn_factor (vLLM's; R1-0528-Qwen3-8B's 0.8782 = 1 / (1 + 0.1 ln 4)) multiplies
// YaRN's own 1 + 0.1 ln(factor), attention_factor (Hugging Face's) replaces it; GGUF's
// yarn_attn_factor multiplies it, as llama.cpp's rope does.
TEST_F(HfFolderTest, Qwen3HeadSizeNormsAndYarn) {
  Json c = llama_config();
  c["architectures"] = {"Qwen3ForCausalLM"};
  c["head_dim"] = 6;  // not kHidden / kHeads
  c["attention_bias"] = false;
  c["tie_word_embeddings"] = true;
  c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32},
                       {"attn_factor", 0.8782488562869419}};
  config(c);
  weights({{"model.layers.0.self_attn.q_norm.weight", "F32", {6}, f32_bytes(6)},
           {"model.layers.0.self_attn.k_norm.weight", "F32", {6}, f32_bytes(6)}});
  GgufFile f = open_model_path(dir());
  EXPECT_EQ(f.get_string("general.architecture"), "qwen3");
  EXPECT_EQ(f.get_int("qwen3.attention.key_length"), 6);
  EXPECT_EQ(f.get_int("qwen3.attention.value_length"), 6);
  EXPECT_EQ(f.get_int("qwen3.rope.dimension_count"), 6);
  EXPECT_EQ(f.get_string("qwen3.rope.scaling.type"), "yarn");
  EXPECT_FLOAT_EQ(static_cast<float>(f.get_float("qwen3.rope.scaling.factor")), 4.0f);
  EXPECT_EQ(f.get_int("qwen3.rope.scaling.original_context_length"), 32);
  EXPECT_FLOAT_EQ(static_cast<float>(f.get_float("qwen3.rope.scaling.yarn_attn_factor")), 0.8782488562869419f);
  EXPECT_FALSE(f.has("qwen3.rope.scaling.yarn_beta_fast"));
  EXPECT_NE(f.find_tensor("blk.0.attn_q_norm.weight"), nullptr);
  EXPECT_NE(f.find_tensor("blk.0.attn_k_norm.weight"), nullptr);
  EXPECT_FALSE(f.has("duet.rope.layout"));
  // attention_factor 1 replaces 1 + 0.1 ln 4: the GGUF factor is its inverse; beta_* carried.
  c["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32},
                       {"attention_factor", 1.0}, {"beta_fast", 16}, {"beta_slow", 2}};
  config(c);
  f = open_model_path(dir());
  EXPECT_NEAR(f.get_float("qwen3.rope.scaling.yarn_attn_factor"), 1.0 / (1.0 + 0.1 * std::log(4.0)), 1e-7);
  EXPECT_FLOAT_EQ(static_cast<float>(f.get_float("qwen3.rope.scaling.yarn_beta_fast")), 16.0f);
  EXPECT_FLOAT_EQ(static_cast<float>(f.get_float("qwen3.rope.scaling.yarn_beta_slow")), 2.0f);
  // Neither: YaRN's own factor, no key.
  c["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32}};
  config(c);
  EXPECT_FALSE(open_model_path(dir()).has("qwen3.rope.scaling.yarn_attn_factor"));
  // What duet cannot honour is refused, naming the key.
  c["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32},
                       {"mscale_all_dim", 1.0}};
  config(c);
  EXPECT_NE(error().find("mscale and mscale_all_dim are DeepSeek-V2/V3's"), std::string::npos);
  c["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  config(c);
  EXPECT_NE(error().find("'original_max_position_embeddings' is missing"), std::string::npos) << error();
  c["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32}};
  c["attention_bias"] = true;
  config(c);
  EXPECT_NE(error().find("duet's qwen3 has no q/k/v/o biases"), std::string::npos) << error();
}

TEST(GenerationConfig, SamplingDefaultsAndStopIds) {
  auto assemble = [](GgufMetadata m) {
    m.emplace_back("tokenizer.ggml.model", GgufValue::str("gpt2"));
    m.emplace_back("tokenizer.ggml.tokens", GgufValue::string_array({"a", "b", "c", "d"}));
    m.emplace_back("tokenizer.ggml.merges", GgufValue::string_array({}));
    m.emplace_back("tokenizer.ggml.eos_token_id", GgufValue::u32(3));
    return GgufFile::assemble("folder", std::move(m), {}, {});
  };
  GgufMetadata m;
  add_hf_generation_config("/nonexistent/generation_config.json", m);  // no file: nothing
  EXPECT_TRUE(m.empty());
  GgufFile plain = assemble({});
  EXPECT_EQ(model_sampling_defaults(plain).temperature, SamplingParams{}.temperature);
  EXPECT_EQ(model_stop_ids(plain, *Tokenizer::from_gguf(plain)), (std::vector<int32_t>{3}));

  TempFolder dir("generation-config");
  write_text(dir.path("generation_config.json"),
             Json{{"temperature", 0.6}, {"top_p", 0.95}, {"top_k", 20}, {"repetition_penalty", 1.1},
                  {"do_sample", true}, {"eos_token_id", {1, 3, 9}}}.dump());
  add_hf_generation_config(dir.path("generation_config.json"), m);
  const GgufFile f = assemble(m);
  const SamplingParams p = model_sampling_defaults(f);
  EXPECT_FLOAT_EQ(p.temperature, 0.6f);
  EXPECT_FLOAT_EQ(p.top_p, 0.95f);
  EXPECT_EQ(p.top_k, 20);
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.1f);
  EXPECT_EQ(p.max_tokens, SamplingParams{}.max_tokens);
  // The tokenizer's eos first, then the config's others inside the vocabulary (9 is not).
  EXPECT_EQ(model_stop_ids(f, *Tokenizer::from_gguf(f)), (std::vector<int32_t>{3, 1}));

  write_text(dir.path("generation_config.json"), Json{{"top_p", 1.5}}.dump());
  m.clear();
  add_hf_generation_config(dir.path("generation_config.json"), m);
  try {
    model_sampling_defaults(assemble(m));
    FAIL() << "top_p 1.5 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p is 1.5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("duet.generation.top_p"), std::string::npos) << e.what();
  }
  write_text(dir.path("generation_config.json"), Json{{"eos_token_id", "x"}}.dump());
  m.clear();
  EXPECT_THROW(add_hf_generation_config(dir.path("generation_config.json"), m), Error);
  // A token id past 32 bits is refused (it was cut to its low bits); a top_k past them means no
  // limit, as 2^31 - 1 does.
  write_text(dir.path("generation_config.json"), Json{{"bos_token_id", int64_t{1} << 40}}.dump());
  m.clear();
  EXPECT_THROW(add_hf_generation_config(dir.path("generation_config.json"), m), Error);
  write_text(dir.path("generation_config.json"), Json{{"top_k", int64_t{1} << 40}}.dump());
  m.clear();
  add_hf_generation_config(dir.path("generation_config.json"), m);
  EXPECT_EQ(model_sampling_defaults(assemble(m)).top_k, INT32_MAX);
}

TEST_F(HfFolderTest, NotAModelFolder) {
  ErrorCode code{};
  std::string e = error(&code);
  EXPECT_EQ(code, ErrorCode::kNotFound);
  EXPECT_NE(e.find("a folder without config.json"), std::string::npos) << e;
  EXPECT_FALSE(is_hf_folder(dir()));
  try {
    open_model_path(dir_.path("missing.gguf"));
    FAIL();
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kNotFound);
  }
}

}  // namespace
}  // namespace duet::testing
