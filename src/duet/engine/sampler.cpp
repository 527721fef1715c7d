#include "duet/engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "duet/core/error.h"

namespace duet {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr size_t kMaxBlock = 256;    // argmax (and top-k) skip whole blocks whose maximum cannot win
constexpr size_t kDrawBlock = 1024;  // a dense draw walks block sums, then one block
constexpr size_t kSortedTopK = 256;  // up to this top_k the kept tokens are simply sorted

using Candidate = std::pair<float, int32_t>;  // (logit or probability mass, token id)

// Most likely first; equal values: lower id first. A function object, so that sorts inline it.
constexpr auto better = [](const Candidate& a, const Candidate& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
};

// ---- four-lane vector kernels (GCC/Clang vector extensions: SSE2 on x86-64, NEON on arm64).
// Written by hand because the compiler does not vectorize float compares and selects under
// the default -ftrapping-math, nor float max reductions without -ffast-math.

using f32x4 = float __attribute__((vector_size(16)));
using i32x4 = int32_t __attribute__((vector_size(16)));

inline f32x4 splat(float v) { return f32x4{v, v, v, v}; }
inline f32x4 load4(const float* p) {
  f32x4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store4(float* p, f32x4 v) { std::memcpy(p, &v, sizeof v); }
// Lanes of `mask` are all ones or all zeros (the result of a vector comparison).
inline f32x4 select4(i32x4 mask, f32x4 a, f32x4 b) { return (f32x4)((mask & (i32x4)a) | (~mask & (i32x4)b)); }

// exp(x) for x <= 0 (Cephes' expf: range reduction to [-ln2/2, ln2/2] and a degree-6
// polynomial, about 1e-7 relative error, exactly 1 at 0). Below -87, where float exp leaves the
// normal range, it returns exactly 0 (-inf included), so a masked token has no mass at all.
inline f32x4 exp4(f32x4 x) {
  const i32x4 low = x < splat(-87.0f);
  const f32x4 xc = select4(low, splat(-87.0f), x);
  const f32x4 n = (xc * splat(1.44269504088896341f) + splat(12582912.0f)) - splat(12582912.0f);  // round
  f32x4 r = xc - n * splat(0.693359375f);
  r = r + n * splat(2.12194440e-4f);
  const f32x4 z = r * r;
  f32x4 y = splat(1.9875691500e-4f);
  y = y * r + splat(1.3981999507e-3f);
  y = y * r + splat(8.3334519073e-3f);
  y = y * r + splat(4.1665795894e-2f);
  y = y * r + splat(1.6666665459e-1f);
  y = y * r + splat(5.0000001201e-1f);
  y = y * z + r + splat(1.0f);
  const f32x4 pow2n = (f32x4)((__builtin_convertvector(n, i32x4) + 127) << 23);
  return (f32x4)(~low & (i32x4)(y * pow2n));
}

// The scalar exp, bit-identical to a lane of exp4.
inline float exp1(float x) { return exp4(splat(x))[0]; }

// Applies f to x[0, n) four at a time into out (which may be x); the tail is padded with -inf.
template <typename F>
inline void map4(const float* x, float* out, size_t n, F f) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) store4(out + i, f(load4(x + i)));
  if (i < n) {
    float tail[4] = {kNegInf, kNegInf, kNegInf, kNegInf};
    std::copy(x + i, x + n, tail);
    store4(tail, f(load4(tail)));
    std::copy(tail, tail + (n - i), out + i);
  }
}

// Largest value of x[0, n) ignoring NaN; -inf when empty.
inline float max_of(const float* x, size_t n) {
  f32x4 a = splat(kNegInf), b = a;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const f32x4 u = load4(x + i), v = load4(x + i + 4);
    a = select4(u > a, u, a);
    b = select4(v > b, v, b);
  }
  a = select4(b > a, b, a);
  float m = kNegInf;
  for (int j = 0; j < 4; ++j) m = a[j] > m ? a[j] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// Sum in double with eight independent accumulators (the compiler vectorizes this one).
inline double sum_of(const float* x, size_t n) {
  double acc[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (size_t j = 0; j < 8; ++j) acc[j] += static_cast<double>(x[i + j]);
  }
  for (; i < n; ++i) acc[0] += static_cast<double>(x[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Sum of the values >= t in x[0, n), in double.
inline double sum_at_least(const float* x, size_t n, float t) {
  float tmp[kDrawBlock];
  double total = 0.0;
  for (size_t b = 0; b < n; b += kDrawBlock) {
    const size_t len = std::min(kDrawBlock, n - b);
    map4(x + b, tmp, len, [t](f32x4 v) { return (f32x4)((v >= splat(t)) & (i32x4)v); });
    total += sum_of(tmp, len);
  }
  return total;
}

// Index of the largest value, ties to the lowest index; 0 when every value is -inf or NaN.
// One pass: a block's maximum is found with vector code, and the block is rescanned only when
// it beats the best so far.
int32_t argmax(const float* x, size_t n) {
  float best = kNegInf;
  size_t best_i = 0;
  for (size_t b = 0; b < n; b += kMaxBlock) {
    const size_t len = std::min(kMaxBlock, n - b);
    const float m = max_of(x + b, len);
    if (m > best) {
      best = m;
      best_i = b;
      while (!(x[best_i] == m)) ++best_i;
    }
  }
  return static_cast<int32_t>(best_i);
}

// out[i] = exp((x[i] - m) * scale), set to 0 below `floor`; returns the sum and, per block of
// kDrawBlock, the partial sums. `out` may be `x`.
double exp_and_sum(const float* x, float* out, size_t n, float m, float scale, float floor,
                   std::vector<double>& block_sums) {
  block_sums.clear();
  double total = 0.0;
  const f32x4 vm = splat(m), vscale = splat(scale), vfloor = splat(floor);
  for (size_t b = 0; b < n; b += kDrawBlock) {
    const size_t len = std::min(kDrawBlock, n - b);
    if (floor > 0.0f) {
      map4(x + b, out + b, len, [&](f32x4 v) {
        const f32x4 e = exp4((v - vm) * vscale);
        return (f32x4)((e >= vfloor) & (i32x4)e);
      });
    } else {
      map4(x + b, out + b, len, [&](f32x4 v) { return exp4((v - vm) * vscale); });
    }
    const double s = sum_of(out + b, len);
    block_sums.push_back(s);
    total += s;
  }
  return total;
}

// log(sum(exp(x))) over x[0, n) whose maximum is m (finite).
double log_sum_exp(const float* x, size_t n, float m) {
  float tmp[kDrawBlock];
  double total = 0.0;
  const f32x4 vm = splat(m);
  for (size_t b = 0; b < n; b += kDrawBlock) {
    const size_t len = std::min(kDrawBlock, n - b);
    map4(x + b, tmp, len, [&](f32x4 v) { return exp4(v - vm); });
    total += sum_of(tmp, len);
  }
  return static_cast<double>(m) + std::log(total);
}

// The k largest values of x[0, n) with their ids into `out`, sorted by better() when `sorted`
// (else in no particular, but deterministic, order). NaN is never chosen. O(n + k log k):
// - a first pass takes the maximum of each block, the blocks being small enough that there are
//   at least 2k of them (when n allows): the k-th largest block maximum is a floor for the top k
//   (k blocks hold a value that large), and blocks below it are never looked at again;
// - the rest enters a buffer of 2k candidates that is cut back to the best k when full, after
//   which only values above the k-th best can enter (a later equal value has a higher id, so it
//   ranks below).
// `scratch` holds the block maxima between calls.
void select_top(const float* x, size_t n, size_t k, std::vector<Candidate>& out, std::vector<float>& scratch,
                bool sorted = true) {
  out.clear();
  k = std::min(k, n);
  if (k == 0) return;
  const size_t block = std::clamp<size_t>(std::bit_floor(n / (2 * k) + 1), 8, kMaxBlock);
  const size_t num_blocks = (n + block - 1) / block;
  float floor = kNegInf;  // every value of the top k is >= floor
  const bool prepass = num_blocks >= k;
  if (prepass) {
    scratch.resize(2 * num_blocks);
    float* block_max = scratch.data();
    float* ranked = block_max + num_blocks;
    for (size_t b = 0; b < num_blocks; ++b) {
      block_max[b] = ranked[b] = max_of(x + b * block, std::min(block, n - b * block));
    }
    std::nth_element(ranked, ranked + (k - 1), ranked + num_blocks, std::greater<float>());
    floor = ranked[k - 1];
  }
  const size_t capacity = 2 * k;
  bool full = false;
  float bound = kNegInf;  // once full: only values > bound can enter
  auto compact = [&] {
    std::nth_element(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(k - 1), out.end(), better);
    out.resize(k);
    bound = out[k - 1].first;
    full = true;
  };
  for (size_t b = 0; b < n; b += block) {
    const size_t len = std::min(block, n - b);
    if (prepass) {
      const float m = scratch[b / block];
      if (m < floor || (full && !(m > bound))) continue;
    }
    for (size_t i = b; i < b + len; ++i) {
      const float v = x[i];
      if (full ? v > bound : v >= floor) {  // NaN fails both
        out.emplace_back(v, static_cast<int32_t>(i));
        if (out.size() == capacity) compact();
      }
    }
  }
  if (out.size() > k) compact();
  if (sorted) std::sort(out.begin(), out.end(), better);
}

// Top-p over a dense array of masses: a histogram of mass over the float bits of e (exponent
// and 3 mantissa bits: buckets 9% wide) from the top down finds the bucket where the mass
// reaches `target`. Only values >= floor are counted (blocks below it are skipped); false when
// they do not reach the target (with floor 0 the lowest bucket is the answer then). `above` is
// the mass of the buckets above the one found.
constexpr int kBucketShift = 20;
constexpr size_t kSkipBlock = 64;
bool find_nucleus_bucket(const float* e, size_t n, float floor, double target, uint32_t& bucket, double& above) {
  // Four interleaved histograms (in one cache line per bucket), so that neighbours in the same
  // bucket do not wait on each other's read-modify-write. e <= 1 has bits below 0x3f800001;
  // larger ones (NaN) go to the last bucket.
  double hist[1024 * 4] = {};
  float v[kSkipBlock];
  for (size_t b = 0; b < n; b += kSkipBlock) {
    const size_t len = std::min(kSkipBlock, n - b);
    if (floor > 0.0f) {  // values below floor count as 0 (in bucket 0), without branches
      if (max_of(e + b, len) < floor) continue;
      map4(e + b, v, len, [floor](f32x4 x) { return (f32x4)((x >= splat(floor)) & (i32x4)x); });
    } else {
      std::copy(e + b, e + b + len, v);
    }
    for (size_t i = 0; i < len; ++i) {
      const uint32_t key = (std::bit_cast<uint32_t>(v[i]) & 0x7fffffffu) >> kBucketShift;
      hist[std::min<uint32_t>(key, 1023) * 4 + (i & 3)] += static_cast<double>(v[i]);
    }
  }
  for (size_t k = 0; k < 1024; ++k) {
    hist[k] = (hist[4 * k] + hist[4 * k + 1]) + (hist[4 * k + 2] + hist[4 * k + 3]);  // in place: k <= 4k
  }
  above = 0.0;
  for (uint32_t b = 1024; b-- > 0;) {
    if (above + hist[b] >= target || (b == 0 && floor == 0.0f)) {  // everything: rounding may fall short
      bucket = b;
      return true;
    }
    above += hist[b];
  }
  return false;
}

// The most likely raw token, among the allowed ones when a mask is given (when processing left
// nothing: min_tokens masking every allowed token).
int32_t fallback_argmax(const float* raw, size_t n, std::span<const uint64_t> allowed,
                        const std::vector<int32_t>& allowed_ids) {
  if (!allowed_ids.empty()) {
    // allowed_token_ids holds even then (with a grammar's set too when they share a token).
    int32_t best = -1, best_in_both = -1;
    for (int32_t id : allowed_ids) {
      if (id < 0 || static_cast<size_t>(id) >= n) continue;
      if (best < 0 || raw[id] > raw[best]) best = id;
      const bool in_grammar = allowed.empty() || (static_cast<size_t>(id / 64) < allowed.size() &&
                                                  ((allowed[id / 64] >> (id & 63)) & 1) != 0);
      if (in_grammar && (best_in_both < 0 || raw[id] > raw[best_in_both])) best_in_both = id;
    }
    if (best_in_both >= 0) return best_in_both;
    if (best >= 0) return best;
  }
  if (allowed.empty()) return argmax(raw, n);
  int32_t best = -1;
  for (size_t i = 0; i < n && i / 64 < allowed.size(); ++i) {
    if (((allowed[i / 64] >> (i & 63)) & 1) != 0 && (best < 0 || raw[i] > raw[best])) best = static_cast<int32_t>(i);
  }
  return best < 0 ? argmax(raw, n) : best;
}

void fill_top(const std::vector<Candidate>& top, double lse, std::vector<TokenLogprob>& out) {
  out.clear();
  out.reserve(top.size());
  for (const Candidate& c : top) {
    out.push_back({c.second, static_cast<float>(static_cast<double>(c.first) - lse)});
  }
}

}  // namespace

const float* Sampler::process(std::span<const float> logits, const SamplingParams& params,
                              const SequenceContext& ctx) {
  const size_t num_vocab = logits.size();
  auto in_vocab = [num_vocab](int32_t id) { return id >= 0 && static_cast<size_t>(id) < num_vocab; };
  const bool mask = ctx.output_ids.size() < static_cast<size_t>(std::max(params.min_tokens, 0)) &&
                    (!params.stop_token_ids.empty() || (!params.ignore_eos && !ctx.eos_ids.empty()));
  const bool repetition =
      params.repetition_penalty != 1.0f && (!ctx.prompt_ids.empty() || !ctx.output_ids.empty());
  const bool additive =
      (params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f) && !ctx.output_ids.empty();
  const bool allowed = !ctx.allowed_tokens.empty();
  const bool allowed_ids = !params.allowed_token_ids.empty();
  // bad_words: the tokens that would end one of the sequences here.
  banned_.clear();
  for (const std::vector<int32_t>& words : params.bad_words_token_ids) {
    if (words.empty() || words.size() - 1 > ctx.output_ids.size()) continue;
    if (std::equal(words.begin(), words.end() - 1, ctx.output_ids.end() - static_cast<std::ptrdiff_t>(words.size() - 1))) {
      banned_.push_back(words.back());
    }
  }
  if (params.logit_bias.empty() && !mask && !repetition && !additive && !allowed && !allowed_ids && banned_.empty()) {
    return logits.data();
  }

  work_.assign(logits.begin(), logits.end());
  float* w = work_.data();
  for (const auto& [id, bias] : params.logit_bias) {
    if (in_vocab(id)) w[id] += bias;
  }
  if (mask) {
    for (int32_t id : params.stop_token_ids) {
      if (in_vocab(id)) w[id] = kNegInf;
    }
    if (!params.ignore_eos) {
      for (int32_t id : ctx.eos_ids) {
        if (in_vocab(id)) w[id] = kNegInf;
      }
    }
  }
  if (repetition || additive) {
    // Distinct tokens and their output counts in O(prompt + output): stamps instead of clearing.
    if (stamp_.size() != num_vocab) {
      stamp_.assign(num_vocab, 0);
      count_.assign(num_vocab, 0);
      epoch_ = 0;
    }
    if (++epoch_ == 0) {
      std::fill(stamp_.begin(), stamp_.end(), 0u);
      epoch_ = 1;
    }
    touched_.clear();
    auto see = [&](int32_t id) {
      if (!in_vocab(id)) return false;
      if (stamp_[id] != epoch_) {
        stamp_[id] = epoch_;
        count_[id] = 0;
        touched_.push_back(id);
      }
      return true;
    };
    if (repetition) {
      for (int32_t id : ctx.prompt_ids) see(id);
    }
    for (int32_t id : ctx.output_ids) {
      if (see(id)) ++count_[id];
    }
    const float penalty = params.repetition_penalty;
    for (int32_t id : touched_) {
      float v = w[id];
      if (repetition) v = v > 0.0f ? v / penalty : v * penalty;
      if (const int32_t count = count_[id]; count > 0) {
        v -= params.frequency_penalty * static_cast<float>(count);
        v -= params.presence_penalty;
      }
      w[id] = v;
    }
  }
  if (allowed_ids) {
    // Only these: their values kept, everything else -inf.
    kept_.clear();
    for (int32_t id : params.allowed_token_ids) {
      if (in_vocab(id)) kept_.emplace_back(id, w[id]);
    }
    std::fill(w, w + num_vocab, kNegInf);
    for (const auto& [id, v] : kept_) w[id] = v;
  }
  for (int32_t id : banned_) {
    if (in_vocab(id)) w[id] = kNegInf;
  }
  if (allowed) {
    const std::span<const uint64_t> bits = ctx.allowed_tokens;
    for (size_t word = 0; word * 64 < num_vocab; ++word) {
      const uint64_t b = word < bits.size() ? bits[word] : 0;
      if (b == ~uint64_t{0}) continue;
      const size_t end = std::min(num_vocab, word * 64 + 64);
      for (size_t i = word * 64; i < end; ++i) {
        if (((b >> (i & 63)) & 1) == 0) w[i] = kNegInf;
      }
    }
  }
  return w;
}

std::span<const float> Sampler::processed_logits(std::span<const float> logits, const SamplingParams& params,
                                                 const SequenceContext& ctx) {
  if (process(logits, params, ctx) == logits.data()) work_.assign(logits.begin(), logits.end());
  return {work_.data(), logits.size()};
}

// Draws from the sorted candidates_ (probability masses relative to the most likely token, most
// likely first): the top-p cut against `total` (the mass they are a share of), then min-p.
int32_t Sampler::draw_sorted(double total, const SamplingParams& params, Rng& rng) {
  size_t cut = candidates_.size();
  if (params.top_p < 1.0f) {
    const double target = static_cast<double>(params.top_p) * total;
    double cumulative = 0.0;
    for (size_t i = 0; i < candidates_.size(); ++i) {
      cumulative += candidates_[i].first;
      if (cumulative >= target) {
        cut = i + 1;
        break;
      }
    }
  }
  if (params.min_p > 0.0f) {
    while (cut > 1 && candidates_[cut - 1].first < params.min_p) --cut;
  }
  double mass = 0.0;
  for (size_t i = 0; i < cut; ++i) mass += candidates_[i].first;
  const double u = rng.uniform() * mass;
  double cumulative = 0.0;
  size_t last = 0;
  for (size_t i = 0; i < cut; ++i) {
    if (candidates_[i].first <= 0.0f) continue;
    cumulative += candidates_[i].first;
    last = i;
    if (u < cumulative) return candidates_[i].second;
  }
  return candidates_[last].second;  // u rounded onto the total
}

// One draw from the probability masses e[0, n) (relative to the most likely token, which has
// 1; min-p already applied when there is no top-p) that sum to `total`, whose kDrawBlock block
// sums are in block_sums_. Returns an index into e. Calls rng.uniform() once.
//
// With top-p the nucleus is a prefix of the tokens sorted by probability. Instead of sorting,
// a histogram of mass over the float bits of e (exponent and 3 mantissa bits: buckets 9% wide)
// finds the bucket B where the mass from the top reaches top_p: every token above B is in the
// nucleus, and only the tokens of B are sorted to find where it ends. The draw then walks the
// tokens above B in index order, or the kept part of B in sorted order.
size_t Sampler::draw_dense(float* e, size_t n, double total, const SamplingParams& params, Rng& rng) {
  if (params.top_p < 1.0f) {
    const double target = static_cast<double>(params.top_p) * total;
    // Tokens below t hold less than n * t of the mass; when that is less than what lies outside
    // the nucleus, they cannot reach into it and the histogram skips them (with real logits,
    // most of the vocabulary). Should rounding defeat that bound, everything is counted.
    const float safe = static_cast<float>((total - target) / static_cast<double>(n) * 0.999);
    uint32_t bucket = 0;
    double above = 0.0;
    if (!find_nucleus_bucket(e, n, safe, target, bucket, above)) find_nucleus_bucket(e, n, 0.0f, target, bucket, above);
    const float lo = std::bit_cast<float>(bucket << kBucketShift);
    const float hi = std::bit_cast<float>((bucket + 1) << kBucketShift);
    if (params.min_p > 0.0f && params.min_p >= hi) {
      // min-p keeps less than the nucleus, which holds everything from B up: the tokens at or
      // above min_p are the answer.
      total = 0.0;
      block_sums_.clear();
      for (size_t b = 0; b < n; b += kDrawBlock) {
        const size_t len = std::min(kDrawBlock, n - b);
        map4(e + b, e + b, len, [&](f32x4 v) { return (f32x4)((v >= splat(params.min_p)) & (i32x4)v); });
        block_sums_.push_back(sum_of(e + b, len));
        total += block_sums_.back();
      }
    } else {
      // The tokens of bucket B: four at a time, and without branches where some are (they are
      // many when the logits are flat).
      if (bucket_.size() < n + 4) bucket_.resize(n + 4);
      size_t count = 0;
      auto take = [&](size_t i) {
        const float v = e[i];
        bucket_[count] = {v, static_cast<int32_t>(i)};
        count += static_cast<size_t>((v >= lo) & (v < hi) & (v > 0.0f));
      };
      size_t i = 0;
      for (; i + 4 <= n; i += 4) {
        const f32x4 v = load4(e + i);
        const i32x4 in = (v >= splat(lo)) & (v < splat(hi)) & (v > splat(0.0f));
        if ((in[0] | in[1] | in[2] | in[3]) == 0) continue;
        take(i), take(i + 1), take(i + 2), take(i + 3);
      }
      for (; i < n; ++i) take(i);
      candidates_.assign(bucket_.begin(), bucket_.begin() + static_cast<std::ptrdiff_t>(count));
      std::sort(candidates_.begin(), candidates_.end(), better);
      size_t cut = candidates_.size();
      double cumulative = above;
      for (size_t i = 0; i < candidates_.size(); ++i) {
        cumulative += candidates_[i].first;
        if (cumulative >= target) {
          cut = i + 1;
          break;
        }
      }
      while (cut > 0 && candidates_[cut - 1].first < params.min_p) --cut;
      double kept = 0.0;
      for (size_t i = 0; i < cut; ++i) kept += candidates_[i].first;
      double u = rng.uniform() * (above + kept);
      if (u >= above && cut > 0) {
        u -= above;
        cumulative = 0.0;
        for (size_t i = 0; i < cut; ++i) {
          cumulative += candidates_[i].first;
          if (u < cumulative) return static_cast<size_t>(candidates_[i].second);
        }
        return static_cast<size_t>(candidates_[cut - 1].second);  // u rounded onto the total
      }
      // The tokens above B, in index order.
      size_t last = 0;
      for (size_t b = 0; b < n; b += kDrawBlock) {
        const size_t len = std::min(kDrawBlock, n - b);
        const double s = sum_at_least(e + b, len, hi);
        if (u >= s) {
          u -= s;
          if (s > 0.0) last = b + len - 1;
          continue;
        }
        cumulative = 0.0;
        for (size_t i = b; i < b + len; ++i) {
          if (!(e[i] >= hi)) continue;
          cumulative += e[i];
          last = i;
          if (u < cumulative) return i;
        }
        return last;
      }
      while (last > 0 && !(e[last] >= hi)) --last;  // u rounded onto the total
      return last;
    }
  }

  double u = rng.uniform() * total;
  for (size_t b = 0; b < block_sums_.size(); ++b) {
    if (u >= block_sums_[b]) {
      u -= block_sums_[b];
      continue;
    }
    const size_t begin = b * kDrawBlock;
    const size_t end = std::min(begin + kDrawBlock, n);
    double cumulative = 0.0;
    size_t last = begin;
    for (size_t i = begin; i < end; ++i) {
      if (!(e[i] > 0.0f)) continue;
      cumulative += e[i];
      last = i;
      if (u < cumulative) return i;
    }
    return last;
  }
  size_t i = n;  // u rounded onto the total: the last token with mass
  while (i > 1 && !(e[i - 1] > 0.0f)) --i;
  return i - 1;
}

// One draw from the processed logits x; -1 when every one is -inf. Calls rng.uniform() once.
int32_t Sampler::draw(const float* x, int32_t num_vocab, const SamplingParams& params, Rng& rng) {
  const size_t n = static_cast<size_t>(num_vocab);
  const float scale = 1.0f / params.temperature;
  if (!(std::isfinite(scale) && scale > 0.0f)) {  // a temperature too small to divide by
    (void)rng.uniform();
    const int32_t id = argmax(x, n);
    return x[id] == kNegInf ? -1 : id;
  }
  // With top-p, min-p applies to the nucleus afterwards, so it cannot zero tokens up front.
  const float floor = params.top_p < 1.0f ? 0.0f : params.min_p;
  const bool top_k = params.top_k > 0 && params.top_k < num_vocab;

  if (top_k && static_cast<size_t>(params.top_k) <= kSortedTopK) {
    select_top(x, n, static_cast<size_t>(params.top_k), candidates_, select_scratch_);
    const float m = candidates_.empty() ? kNegInf : candidates_.front().first;
    if (m == kNegInf) {
      (void)rng.uniform();
      return -1;
    }
    double total = 0.0;
    for (Candidate& c : candidates_) {
      c.first = exp1((c.first - m) * scale);
      total += c.first;
    }
    return draw_sorted(total, params, rng);
  }

  if (top_k) {  // a large top-k set: its values into work_, its ids aside, then as dense
    select_top(x, n, static_cast<size_t>(params.top_k), candidates_, select_scratch_, false);
    const size_t k = candidates_.size();
    work_.resize(std::max(work_.size(), k));
    candidate_ids_.resize(k);
    float m = kNegInf;
    for (size_t i = 0; i < k; ++i) {
      work_[i] = candidates_[i].first;
      candidate_ids_[i] = candidates_[i].second;
      m = std::max(m, work_[i]);
    }
    if (m == kNegInf) {
      (void)rng.uniform();
      return -1;
    }
    const double total = exp_and_sum(work_.data(), work_.data(), k, m, scale, floor, block_sums_);
    return candidate_ids_[draw_dense(work_.data(), k, total, params, rng)];
  }

  const float m = max_of(x, n);
  if (m == kNegInf) {
    (void)rng.uniform();
    return -1;
  }
  if (x != work_.data()) work_.resize(n);
  const double total = exp_and_sum(x, work_.data(), n, m, scale, floor, block_sums_);
  return static_cast<int32_t>(draw_dense(work_.data(), n, total, params, rng));
}

SampledToken Sampler::sample(std::span<const float> logits, const SamplingParams& params,
                             const SequenceContext& ctx, Rng& rng) {
  const size_t n = logits.size();
  if (n == 0 || n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    fail(ErrorCode::kInternal, "sampling from a row of {} logits", n);
  }
  const float* raw = logits.data();
  const float* x = process(logits, params, ctx);
  int32_t id;
  if (params.greedy()) {
    id = argmax(x, n);
    if (x[id] == kNegInf && x != raw) id = -1;
  } else {
    id = draw(x, static_cast<int32_t>(n), params, rng);
  }
  if (id < 0) id = fallback_argmax(raw, n, ctx.allowed_tokens, params.allowed_token_ids);

  SampledToken out;
  out.token_id = id;
  if (params.logprobs || params.ranks_candidates()) {
    const double lse = log_normalizer(logits);
    out.logprob = static_cast<float>(static_cast<double>(raw[id]) - lse);
    if (params.logprobs && *params.logprobs > 0) {
      select_top(raw, n, static_cast<size_t>(*params.logprobs), candidates_, select_scratch_);
      fill_top(candidates_, lse, out.top);
    }
  }
  return out;
}

double Sampler::log_normalizer(std::span<const float> logits) {
  const float m = max_of(logits.data(), logits.size());
  return std::isfinite(m) ? log_sum_exp(logits.data(), logits.size(), m) : static_cast<double>(m);
}

std::vector<TokenLogprob> Sampler::top_logprobs(std::span<const float> logits, int32_t k) {
  std::vector<TokenLogprob> out;
  const size_t n = logits.size();
  if (n == 0 || k <= 0) return out;
  const double lse = log_normalizer(logits);
  std::vector<Candidate> top;
  std::vector<float> scratch;
  select_top(logits.data(), n, static_cast<size_t>(k), top, scratch);
  fill_top(top, lse, out);
  return out;
}

}  // namespace duet
