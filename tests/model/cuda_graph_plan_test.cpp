// Decode steps as CUDA graphs, everything but the capture itself (which needs a GPU): the table
// stride, the recorder's staging and trace, the policy (warm-up, capture, replay, refusal,
// eviction), the graph layout of an attention plan, the row-at-a-time matmul plan, which steps
// qualify and how they are padded, and the executor's use of a device with graphs: a stand-in
// device (the CPU's ops, treating padding rows as the CUDA ops do) gives the same logits, bit for
// bit, as the plain CPU device, while the steps it was handed as graphs are the decode steps, with
// the buckets and context classes expected.
#include <cstring>
#include <map>

#include <gtest/gtest.h>

#include "duet/backend/cuda/graph_plan.h"
#include "duet/backend/cuda/plan.h"
#include "duet/core/error.h"
#include "duet/model/decode_graph.h"
#include "model_fixture.h"

namespace duet {
namespace {

using cuda::GraphKey;
using cuda::GraphPolicy;
using cuda::StepRecorder;

TEST(CudaGraphPlan, TableStrideIsAPowerOfTwoOfAtLeastSixteen) {
  EXPECT_EQ(cuda::graph_table_stride(0), 16);
  EXPECT_EQ(cuda::graph_table_stride(16), 16);
  EXPECT_EQ(cuda::graph_table_stride(17), 32);
  EXPECT_EQ(cuda::graph_table_stride(1000), 1024);
  EXPECT_EQ(cuda::graph_table_stride(1024), 1024);
}

TEST(CudaGraphPlan, RecorderStagesOnceAndTracesEverything) {
  std::vector<unsigned char> area(4096);
  StepRecorder r(area.data(), area.size());
  r.begin(StepRecorder::Mode::kDry);
  EXPECT_FALSE(r.launching());
  const std::vector<int32_t> table = {3, 1, 4, 1, 5};
  const std::vector<int32_t> same = table, other = {3, 1, 4, 1, 6};
  const size_t a = r.stage(StepRecorder::Upload::kAttention, table.data(), table.size() * 4);
  const size_t b = r.stage(StepRecorder::Upload::kAttention, same.data(), same.size() * 4);
  const size_t c = r.stage(StepRecorder::Upload::kAttention, other.data(), other.size() * 4);
  const size_t d = r.stage(StepRecorder::Upload::kPositions, table.data(), table.size() * 4);  // another kind
  EXPECT_EQ(a, b);  // every layer's tables: one copy
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  for (size_t off : {a, c, d}) EXPECT_EQ(off % 256, 0u);
  EXPECT_EQ(std::memcmp(area.data() + c, other.data(), other.size() * 4), 0);
  EXPECT_EQ(r.staged_bytes(), 3 * 256u);
  // Too much for the area: an error naming the sizes, not an overrun.
  std::vector<unsigned char> big(4096, 7);
  try {
    r.stage(StepRecorder::Upload::kIds, big.data(), big.size());
    FAIL() << "staged more than the area";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted);
    EXPECT_NE(std::string(e.what()).find("4096"), std::string::npos) << e.what();
  }

  // The same ops with the same arguments trace the same; any argument that differs shows.
  float x = 0, y = 0;
  const auto step = [&](StepRecorder& rec, float* ptr, int64_t n, float eps, const std::vector<int32_t>& ids) {
    rec.begin(StepRecorder::Mode::kCapture);
    rec.trace(3, ptr, n, eps, DType::kQ8_0, true);
    rec.stage(StepRecorder::Upload::kIds, ids.data(), ids.size() * 4);
    return rec.recorded();
  };
  const std::vector<int64_t> first = step(r, &x, 8, 1e-6f, table);
  EXPECT_TRUE(r.launching());
  EXPECT_EQ(step(r, &x, 8, 1e-6f, other), first);  // other ids, same place: the same launches
  EXPECT_NE(step(r, &y, 8, 1e-6f, table), first);
  EXPECT_NE(step(r, &x, 9, 1e-6f, table), first);
  EXPECT_NE(step(r, &x, 8, 1e-5f, table), first);
  EXPECT_NE(step(r, &x, 8, 1e-6f, {1, 2, 3, 4, 5, 6}), first);  // a longer upload
}

TEST(CudaGraphPlan, PolicyWarmsUpCapturesReplaysAndRefuses) {
  GraphPolicy p;
  const GraphKey k{8, 256};
  int destroyed = 0;
  const auto graph = [&] { return std::shared_ptr<void>(new int(1), [&](void* g) { delete static_cast<int*>(g); ++destroyed; }); };
  EXPECT_EQ(p.next(k), GraphPolicy::Action::kPlain);  // the warm-up
  EXPECT_EQ(p.next(k), GraphPolicy::Action::kCapture);
  p.captured(k, graph(), {1, 2, 3});
  ASSERT_NE(p.trace(k), nullptr);
  EXPECT_EQ(*p.trace(k), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(p.next(k), GraphPolicy::Action::kReplay);
  p.replayed(k);
  // A changed trace drops the graph; the next step captures again (it ran plain meanwhile).
  p.mismatched(k);
  EXPECT_EQ(destroyed, 1);
  EXPECT_EQ(p.trace(k), nullptr);
  EXPECT_EQ(p.next(k), GraphPolicy::Action::kCapture);
  p.captured(k, graph(), {4});
  p.replayed(k);
  p.mismatched(k);  // after a replay (a buffer it used moved, say): not held against the key
  // Captures whose very next step differs: refused after kMaxMismatches in a row.
  for (int i = 0; i < GraphPolicy::kMaxMismatches; ++i) {
    EXPECT_TRUE(p.refused(k).empty());
    EXPECT_EQ(p.next(k), GraphPolicy::Action::kCapture);
    p.captured(k, graph(), {5});
    p.mismatched(k);
  }
  EXPECT_NE(p.refused(k).find("right after"), std::string::npos) << p.refused(k);
  EXPECT_EQ(p.next(k), GraphPolicy::Action::kPlain);
  EXPECT_EQ(p.next(k), GraphPolicy::Action::kPlain);

  // Capture failures: refused after the second, with the reason.
  const GraphKey f{1, 256};
  EXPECT_EQ(p.next(f), GraphPolicy::Action::kPlain);
  EXPECT_EQ(p.next(f), GraphPolicy::Action::kCapture);
  p.capture_failed(f, "operation not permitted when stream is capturing");
  EXPECT_EQ(p.next(f), GraphPolicy::Action::kCapture);
  p.capture_failed(f, "operation not permitted when stream is capturing");
  EXPECT_NE(p.refused(f).find("not permitted"), std::string::npos);
  EXPECT_EQ(p.next(f), GraphPolicy::Action::kPlain);
  const GraphPolicy::Stats s = p.stats();
  EXPECT_EQ(s.captures, 2 + GraphPolicy::kMaxMismatches);
  EXPECT_EQ(s.replays, 2);
  EXPECT_EQ(s.mismatches, 2 + GraphPolicy::kMaxMismatches);
  EXPECT_EQ(s.capture_failures, 2);
  destroyed = 0;
  p.clear();
  EXPECT_EQ(p.num_graphs(), 0u);
  EXPECT_TRUE(p.refused(f).empty());  // forgotten: a new model starts afresh
}

TEST(CudaGraphPlan, PolicyKeepsTheMostRecentlyUsedGraphs) {
  GraphPolicy p;
  int destroyed = 0;
  const auto graph = [&] { return std::shared_ptr<void>(new int(1), [&](void* g) { delete static_cast<int*>(g); ++destroyed; }); };
  const auto n = static_cast<int64_t>(GraphPolicy::kMaxGraphs);
  for (int64_t i = 0; i <= n; ++i) {
    const GraphKey k{i + 1, 256};
    p.next(k);
    p.next(k);
    p.captured(k, graph(), {i});
    if (i == 1) p.next(GraphKey{1, 256});  // key 1 used again: key 2 is now the oldest
  }
  EXPECT_EQ(p.num_graphs(), GraphPolicy::kMaxGraphs);
  EXPECT_EQ(destroyed, 1);
  EXPECT_EQ(p.trace(GraphKey{2, 256}), nullptr);
  EXPECT_NE(p.trace(GraphKey{1, 256}), nullptr);
  EXPECT_EQ(p.next(GraphKey{2, 256}), GraphPolicy::Action::kCapture);  // evicted, not refused
  EXPECT_EQ(p.stats().evictions, 1);
}

// A decode batch of `contexts.size()` sequences, each with its own blocks (block size 4).
struct DecodeBatch {
  BatchInput batch;
  std::vector<std::vector<int32_t>> tables;
  explicit DecodeBatch(const std::vector<int32_t>& contexts) {
    batch.attention.block_size = 4;
    int32_t next = 0;
    for (int32_t ctx : contexts) {
      std::vector<int32_t>& t = tables.emplace_back();
      for (int32_t b = 0; b < (ctx + 3) / 4; ++b) t.push_back(next++);
    }
    for (size_t i = 0; i < contexts.size(); ++i) {
      const int32_t token = static_cast<int32_t>(10 + i);
      batch.add_sequence(std::span<const int32_t>(&token, 1), contexts[i] - 1, tables[i], BatchInput::Logits::kLast);
    }
  }
};

TEST(CudaGraphPlan, AttentionLayoutForAGraphDependsOnTheBucketNotTheContexts) {
  const Backend::AttentionShape shape{8, 2, 64, 64, 128, 128, KvDtype::kF16};
  BatchInput short_padded, long_padded;
  const DecodeBatch a({5, 1, 9}), b({40, 33, 17});
  pad_decode_batch(a.batch, 4, short_padded);
  pad_decode_batch(b.batch, 4, long_padded);
  const cuda::AttentionPlan pa = cuda::plan_attention(short_padded.attention, shape, true);
  const cuda::AttentionPlan pb = cuda::plan_attention(long_padded.attention, shape, true);
  EXPECT_EQ(pa.num_tiles, pb.num_tiles);
  EXPECT_EQ(pa.meta.size(), pb.meta.size());
  EXPECT_EQ(pa.tables_offset, pb.tables_offset);
  EXPECT_EQ(pa.key_tile, pb.key_tile);
  // Each sequence's table at its stride (16 blocks), padding sequences with context 0.
  for (int64_t s = 0; s < 4; ++s) {
    const int32_t* info = pb.meta.data() + pb.seqs_offset + s * 4;
    EXPECT_EQ(info[3], s * 16);
    if (s < 3) {
      EXPECT_EQ(info[2], b.batch.attention.seqs[static_cast<size_t>(s)].context_len);
      for (int32_t i = 0; i < (info[2] + 3) / 4; ++i) EXPECT_EQ(pb.meta[static_cast<size_t>(pb.tables_offset + info[3] + i)], b.tables[static_cast<size_t>(s)][static_cast<size_t>(i)]);
    } else {
      EXPECT_EQ(info[2], 0);
    }
  }
  // A context past 16 blocks takes the next stride: another layout (and another graph key).
  const DecodeBatch c({65});
  const cuda::AttentionPlan pc = cuda::plan_attention(c.batch.attention, shape, true);
  EXPECT_EQ(pc.meta.size() - static_cast<size_t>(pc.tables_offset), 32u);
  // Outside a graph (a padded step's warm-up) the tables are packed, padding rows included.
  const cuda::AttentionPlan packed = cuda::plan_attention(long_padded.attention, shape);
  EXPECT_EQ(packed.num_tiles, pb.num_tiles);
  EXPECT_EQ(packed.meta.size() - static_cast<size_t>(packed.tables_offset), 10u + 9u + 5u);
  // A sequence with more new tokens than context is still refused.
  BatchInput bad = long_padded;
  bad.attention.seqs[0].context_len = 0;
  bad.attention.seqs[0].num_tokens = 2;
  EXPECT_THROW(cuda::plan_attention(bad.attention, shape, true), Error);
}

TEST(CudaGraphPlan, RowsAloneMatmulIsOneGemvOverEveryRow) {
  const cuda::ScratchLayout s = cuda::scratch_layout(size_t{16} << 20);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_K}) {
    const cuda::MatmulPlan p = cuda::plan_matmul(t, 300, 256, 77, s, true);
    EXPECT_EQ(p.path, cuda::MatmulPath::kGemv) << dtype_name(t);
    ASSERT_EQ(p.tiles.size(), 1u);
    EXPECT_EQ(p.tiles[0].rows, 300);
    EXPECT_EQ(p.tiles[0].m, 77);
  }
  EXPECT_EQ(cuda::plan_matmul(DType::kF32, 300, 256, 77, s).path, cuda::MatmulPath::kCublasF32);
}

TEST(DecodeGraph, WhichStepsQualifyAndTheirBuckets) {
  std::string why;
  EXPECT_EQ(decode_graph_bucket(DecodeBatch({5}).batch), 1);
  EXPECT_EQ(decode_graph_bucket(DecodeBatch({5, 6, 7}).batch), 4);
  EXPECT_EQ(decode_graph_bucket(DecodeBatch(std::vector<int32_t>(5, 3)).batch), 8);
  EXPECT_EQ(decode_graph_bucket(DecodeBatch(std::vector<int32_t>(17, 3)).batch), 24);
  EXPECT_EQ(decode_graph_bucket(DecodeBatch(std::vector<int32_t>(128, 3)).batch), 128);
  EXPECT_EQ(decode_graph_bucket(DecodeBatch(std::vector<int32_t>(129, 3)).batch, &why), 0);
  EXPECT_NE(why.find("129"), std::string::npos) << why;
  // A prefill (or a chunk) in the step: not a graph.
  DecodeBatch mixed({5, 6});
  const std::vector<int32_t> prompt = {1, 2, 3};
  const std::vector<int32_t> table = {40};
  mixed.batch.add_sequence(prompt, 0, table, BatchInput::Logits::kLast);
  EXPECT_EQ(decode_graph_bucket(mixed.batch, &why), 0);
  EXPECT_NE(why.find("new token"), std::string::npos) << why;
  // Logits not wanted for every row (a step of a pipeline's micro-batch is the same batch).
  DecodeBatch partial({5, 6});
  partial.batch.logits_rows = {1};
  EXPECT_EQ(decode_graph_bucket(partial.batch, &why), 0);
  // The hidden states wanted too (MTP drafting reads them): not a graph.
  DecodeBatch drafting({5, 6});
  std::vector<float> hidden(2 * 128);
  drafting.batch.hidden_out = hidden.data();
  EXPECT_EQ(decode_graph_bucket(drafting.batch, &why), 0);
  EXPECT_NE(why.find("hidden"), std::string::npos) << why;
  EXPECT_EQ(decode_graph_bucket(BatchInput{}, &why), 0);
  // Context classes.
  EXPECT_EQ(decode_graph_context(DecodeBatch({5, 200}).batch), 256);
  EXPECT_EQ(decode_graph_context(DecodeBatch({5, 257}).batch), 512);
  EXPECT_EQ(decode_graph_context(DecodeBatch({5000}).batch), 8192);
}

TEST(DecodeGraph, PaddingRowsComeAfterTheRealOnesAndTouchNothing) {
  const DecodeBatch d({5, 9, 2});
  BatchInput out;
  out.windowed.emplace_back();  // stale state of the previous step is cleared
  pad_decode_batch(d.batch, 8, out);
  ASSERT_EQ(out.num_tokens(), 8);
  EXPECT_TRUE(out.windowed.empty());
  EXPECT_EQ(out.attention.num_tokens, 8);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(out.logits_rows[i], static_cast<int32_t>(i));
    const PagedSequence& ps = out.attention.seqs[i];
    EXPECT_EQ(ps.token_start, static_cast<int32_t>(i));
    EXPECT_EQ(ps.num_tokens, 1);
    if (i < 3) {
      EXPECT_EQ(out.token_ids[i], d.batch.token_ids[i]);
      EXPECT_EQ(out.positions[i], d.batch.positions[i]);
      EXPECT_EQ(out.slot_mapping[i], d.batch.slot_mapping[i]);
      EXPECT_EQ(ps.context_len, d.batch.attention.seqs[i].context_len);
      EXPECT_EQ(ps.block_table, d.tables[i].data());
    } else {
      EXPECT_EQ(out.token_ids[i], 0);
      EXPECT_EQ(out.positions[i], 0);
      EXPECT_EQ(out.slot_mapping[i], -1);
      EXPECT_EQ(ps.context_len, 0);
      EXPECT_EQ(ps.num_blocks, 0);
    }
  }
  EXPECT_THROW(pad_decode_batch(d.batch, 2, out), Error);
}

// The CPU's ops, with padding rows treated as the CUDA ops treat them: no K/V stored for slot -1,
// no attention (rows of 0) for a sequence of context 0.
class PaddingAwareBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  void store_kv(const float* rows, const int64_t* slots, int64_t n, int64_t row_dim, void* cache,
                KvDtype dtype) override {
    int64_t real = n;
    while (real > 0 && slots[real - 1] < 0) --real;
    ForwardingBackend::store_kv(rows, slots, real, row_dim, cache, dtype);
  }
  void paged_attention(const float* q, const void* k_cache, const void* v_cache, float* out,
                       const PagedAttentionBatch& batch, const AttentionShape& shape, float scale) override {
    PagedAttentionBatch real = batch;
    real.seqs.clear();
    for (const PagedSequence& ps : batch.seqs) {
      if (ps.context_len > 0) {
        real.seqs.push_back(ps);
      } else {
        const int64_t row = shape.num_heads * shape.head_dim_v;
        std::fill_n(out + ps.token_start * row, ps.num_tokens * row, 0.0f);
      }
    }
    ForwardingBackend::paged_attention(q, k_cache, v_cache, out, real, shape, scale);
  }
};

// A device that hands its decode steps to a StepGraphs which records what it was given and runs
// the ops as they are (the capture and replay themselves are the GPU's).
class RecordingGraphs final : public StepGraphs {
 public:
  Ran run(const Key& key, const std::function<void()>& ops) override {
    keys.push_back(key);
    ops();
    return Ran::kReplayed;
  }
  void clear() override {}
  Stats stats() const override { return {}; }
  std::vector<Key> keys;
};

class GraphDevice final : public Device {
 public:
  explicit GraphDevice(Backend& cpu) : Device("graphs:0"), ops_(cpu), inner_(make_host_device(ops_)) {}
  DeviceInfo info() const override { return inner_->info(); }
  Backend& backend() override { return ops_; }
  bool host_accessible() const override { return true; }
  DeviceBuffer allocate(size_t bytes, MemoryKind kind) override { return inner_->allocate(bytes, kind); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { inner_->copy_from_host(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { inner_->copy_to_host(dst, src, bytes); }
  std::unique_ptr<LoadedWeights> load_weights(std::span<const WeightRef> tensors) override {
    return inner_->load_weights(tensors);
  }
  StepGraphs* step_graphs() override { return &graphs; }
  RecordingGraphs graphs;

 private:
  PaddingAwareBackend ops_;
  std::shared_ptr<Device> inner_;
};

class ExecutorGraphs : public ModelFileTest {};

// Prefills of three sequences, then decode steps of three (bucket 4) and, with two more
// sequences, five (bucket 8), one step mixing a prefill in: the logits on the graph device equal
// the plain CPU device's bit for bit, and exactly the decode steps went to its graphs.
TEST_F(ExecutorGraphs, DecodeStepsArePaddedToTheirBucketAndGiveTheSameLogits) {
  for (const std::string preset : {"tiny", "deepseek2-tiny-v3"}) {
    SyntheticSpec spec = synthetic_preset(preset);
    spec.num_layers = 2;
    const std::string path = write_model(preset + ".gguf", DType::kQ8_0, spec);
    auto file = std::make_shared<const GgufFile>(GgufFile::open(path));
    const std::unique_ptr<Model> plain = load(path);
    auto device = std::make_shared<GraphDevice>(*backend_);
    const std::unique_ptr<Model> graphed = load_model(file, place_all_on(*file, device, 0));
    const int64_t vocab = plain->config().num_vocab;
    auto plain_cache = plain->new_kv_cache(64, 4, KvDtype::kF16);
    auto graph_cache = graphed->new_kv_cache(64, 4, KvDtype::kF16);
    std::vector<std::vector<int32_t>> tables(5);
    for (int32_t s = 0; s < 5; ++s) {
      for (int32_t b = 0; b < 12; ++b) tables[static_cast<size_t>(s)].push_back(s * 12 + b);
    }
    std::vector<int32_t> lengths;
    const auto step = [&](const std::vector<std::pair<int32_t, std::vector<int32_t>>>& seqs) {
      BatchInput batch;
      batch.attention.block_size = 4;
      for (const auto& [s, tokens] : seqs) {
        batch.add_sequence(tokens, lengths[static_cast<size_t>(s)], tables[static_cast<size_t>(s)],
                           BatchInput::Logits::kLast);
        lengths[static_cast<size_t>(s)] += static_cast<int32_t>(tokens.size());
      }
      std::vector<float> want(seqs.size() * static_cast<size_t>(vocab)), got(want.size(), -1.0f);
      plain->forward(batch, *plain_cache, want.data());
      graphed->forward(batch, *graph_cache, got.data());
      EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0) << preset;
    };
    lengths.assign(5, 0);
    step({{0, {1, 2, 3, 4, 5}}, {1, {6, 7}}, {2, {8, 9, 10, 11, 12, 13, 14}}});
    for (int i = 0; i < 3; ++i) step({{0, {20 + i}}, {1, {30 + i}}, {2, {40 + i}}});
    step({{0, {50}}, {1, {51}}, {2, {52}}, {3, {1, 2, 3}}});  // a prefill joins: plain
    step({{3, {60}}, {4, {61, 62}}});                            // a prefill: plain
    for (int i = 0; i < 2; ++i) step({{0, {70 + i}}, {1, {71}}, {2, {72}}, {3, {73}}, {4, {74}}});
    const std::vector<StepGraphs::Key>& keys = device->graphs.keys;
    ASSERT_EQ(keys.size(), 5u) << preset;
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_EQ(keys[i].num_seqs, i < 3 ? 4 : 8) << preset << " step " << i;
      EXPECT_EQ(keys[i].context, 256) << preset;
    }
  }
}

}  // namespace
}  // namespace duet
