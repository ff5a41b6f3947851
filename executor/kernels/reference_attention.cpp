// CPU reference attention: naive per-(batch, head, query) softmax over keys, with GQA and the log-sum-exp.
#include "executor/kernels/reference_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace megatune::executor::reference {
namespace {

struct Indexer {
  const AttentionShape& shape;
  int64_t q_at(int64_t b, int64_t s, int64_t h) const {
    return (b * shape.seq_len + s) * shape.q_stride() + h * shape.head_dim;
  }
  int64_t kv_at(int64_t b, int64_t s, int64_t g) const {
    return (b * shape.seq_len + s) * shape.kv_stride() + g * shape.head_dim;
  }
  int64_t o_at(int64_t b, int64_t s, int64_t h) const {
    return (b * shape.seq_len + s) * shape.o_stride() + h * shape.head_dim;
  }
  int64_t lse_at(int64_t b, int64_t h, int64_t s) const {
    return (b * shape.num_heads + h) * shape.seq_len + s;
  }
  int64_t group_of(int64_t h) const { return h / (shape.num_heads / shape.num_kv_heads); }
  int64_t last_key(int64_t i) const { return shape.causal ? i : shape.seq_len - 1; }
};

double dot(const float* a, const float* b, int64_t d) {
  double sum = 0;
  for (int64_t x = 0; x < d; ++x) sum += double(a[x]) * double(b[x]);
  return sum;
}

}  // namespace

void attention_forward(const AttentionShape& shape, const float* q, const float* k, const float* v, float* o,
                       float* lse) {
  validate_attention_shape(shape);
  const Indexer ix{shape};
  const int64_t s = shape.seq_len, d = shape.head_dim;
  const double scale = shape.scale();
  std::vector<double> scores(static_cast<size_t>(s)), acc(static_cast<size_t>(d));
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.num_heads; ++h) {
      const int64_t g = ix.group_of(h);
      for (int64_t i = 0; i < s; ++i) {
        const float* qi = q + ix.q_at(b, i, h);
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= ix.last_key(i); ++j) {
          scores[j] = scale * dot(qi, k + ix.kv_at(b, j, g), d);
          max_score = std::max(max_score, scores[j]);
        }
        double denominator = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j <= ix.last_key(i); ++j) {
          const double p = std::exp(scores[j] - max_score);
          denominator += p;
          const float* vj = v + ix.kv_at(b, j, g);
          for (int64_t x = 0; x < d; ++x) acc[x] += p * vj[x];
        }
        float* oi = o + ix.o_at(b, i, h);
        for (int64_t x = 0; x < d; ++x) oi[x] = float(acc[x] / denominator);
        lse[ix.lse_at(b, h, i)] = float(max_score + std::log(denominator));
      }
    }
  }
}

void attention_backward(const AttentionShape& shape, const float* q, const float* k, const float* v,
                        const float* o, const float* lse, const float* d_o, float* dq, float* dk, float* dv) {
  validate_attention_shape(shape);
  const Indexer ix{shape};
  const int64_t s = shape.seq_len, d = shape.head_dim;
  const double scale = shape.scale();
  // dk and dv accumulate over the heads of a group and the queries: zero the slices first.
  for (int64_t b = 0; b < shape.batch; ++b)
    for (int64_t j = 0; j < s; ++j)
      for (int64_t g = 0; g < shape.num_kv_heads; ++g) {
        std::fill_n(dk + ix.kv_at(b, j, g), d, 0.0f);
        std::fill_n(dv + ix.kv_at(b, j, g), d, 0.0f);
      }
  std::vector<double> dq_acc(static_cast<size_t>(d));
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.num_heads; ++h) {
      const int64_t g = ix.group_of(h);
      for (int64_t i = 0; i < s; ++i) {
        const float* qi = q + ix.q_at(b, i, h);
        const float* doi = d_o + ix.o_at(b, i, h);
        const double delta = dot(doi, o + ix.o_at(b, i, h), d);  // D_i = rowsum(dO o O)
        const double row_lse = lse[ix.lse_at(b, h, i)];
        std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
        for (int64_t j = 0; j <= ix.last_key(i); ++j) {
          const float* kj = k + ix.kv_at(b, j, g);
          const float* vj = v + ix.kv_at(b, j, g);
          const double p = std::exp(scale * dot(qi, kj, d) - row_lse);
          const double dp = dot(doi, vj, d);
          const double ds = p * (dp - delta);
          float* dvj = dv + ix.kv_at(b, j, g);
          float* dkj = dk + ix.kv_at(b, j, g);
          for (int64_t x = 0; x < d; ++x) {
            dvj[x] += float(p * doi[x]);
            dkj[x] += float(scale * ds * qi[x]);
            dq_acc[x] += scale * ds * kj[x];
          }
        }
        float* dqi = dq + ix.q_at(b, i, h);
        for (int64_t x = 0; x < d; ++x) dqi[x] = float(dq_acc[x]);
      }
    }
  }
}

}  // namespace megatune::executor::reference
