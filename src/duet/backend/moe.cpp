#include "duet/backend/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "duet/core/error.h"

namespace duet {

void moe_route_ref(const float* logits, int64_t n, const MoeRouting& r, int32_t* ids, float* weights) {
  const int64_t E = r.num_experts, k = r.num_used, G = std::max<int64_t>(1, r.num_groups);
  if (E <= 0 || k <= 0 || k > E || E % G != 0 || r.num_groups_used < 1 || r.num_groups_used > G) {
    fail(ErrorCode::kInvalidArgument, "MoE routing of {} experts, {} used, {} groups of which {} used is inconsistent",
         E, k, G, r.num_groups_used);
  }
  const int64_t per_group = E / G;
  const bool softmax = r.gating == MoeRouting::Gating::kSoftmax;
  std::vector<double> score(static_cast<size_t>(E)), pick(static_cast<size_t>(E));
  std::vector<double> group_score(static_cast<size_t>(G));
  std::vector<int64_t> order(static_cast<size_t>(std::max(E, G)));
  std::vector<char> keep(static_cast<size_t>(G));
  for (int64_t t = 0; t < n; ++t) {
    const float* lg = logits + t * E;
    if (softmax) {
      const double max = *std::max_element(lg, lg + E);
      double sum = 0.0;
      for (int64_t e = 0; e < E; ++e) sum += (score[e] = std::exp(lg[e] - max));
      for (int64_t e = 0; e < E; ++e) score[e] /= sum;
    } else {
      for (int64_t e = 0; e < E; ++e) score[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(lg[e])));
    }
    // What the choice ranks: V3 adds the correction bias; the weights stay the unbiased scores.
    for (int64_t e = 0; e < E; ++e) pick[e] = score[e] + (r.bias != nullptr ? r.bias[e] : 0.0);
    if (G > 1) {
      // Group scores: V2 the best expert of the group, V3 the sum of the best two.
      for (int64_t g = 0; g < G; ++g) {
        const double* s = pick.data() + g * per_group;
        if (softmax) {
          group_score[g] = *std::max_element(s, s + per_group);
        } else {
          double a = -INFINITY, b = -INFINITY;
          for (int64_t i = 0; i < per_group; ++i) {
            if (s[i] > a) {
              b = a;
              a = s[i];
            } else if (s[i] > b) {
              b = s[i];
            }
          }
          group_score[g] = a + (per_group > 1 ? b : 0.0);
        }
      }
      std::iota(order.begin(), order.begin() + G, 0);
      std::stable_sort(order.begin(), order.begin() + G,
                       [&](int64_t a, int64_t b) { return group_score[a] > group_score[b]; });
      std::fill(keep.begin(), keep.end(), 0);
      for (int64_t g = 0; g < r.num_groups_used; ++g) keep[static_cast<size_t>(order[g])] = 1;
      // Experts of the other groups cannot be chosen.
      for (int64_t e = 0; e < E; ++e) {
        if (!keep[static_cast<size_t>(e / per_group)]) pick[e] = -INFINITY;
      }
    }
    std::iota(order.begin(), order.begin() + E, 0);
    std::partial_sort(order.begin(), order.begin() + k, order.begin() + E,
                      [&](int64_t a, int64_t b) { return pick[a] > pick[b] || (pick[a] == pick[b] && a < b); });
    double total = 0.0;
    for (int64_t i = 0; i < k; ++i) total += score[order[i]];
    for (int64_t i = 0; i < k; ++i) {
      double w = score[order[i]];
      if (k > 1 && r.norm_topk) {
        w /= total + 1e-20;
        if (!softmax) w *= r.routed_scaling;  // V3 scales after normalizing
      } else {
        w *= r.routed_scaling;
      }
      ids[t * k + i] = static_cast<int32_t>(order[i]);
      weights[t * k + i] = static_cast<float>(w);
    }
  }
}

}  // namespace duet
