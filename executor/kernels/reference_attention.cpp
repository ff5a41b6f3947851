// CPU reference attention: naive per-(batch, head, query) softmax over the attended keys, with GQA and the
// log-sum-exp.
#include "executor/kernels/reference_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace megatune::executor::reference {
namespace {

struct Indexer {
  const AttentionShape& shape;
  int64_t q_at(int64_t b, int64_t i, int64_t h, int64_t stride) const {
    return (b * shape.seq_q + i) * stride + h * shape.head_dim;
  }
  int64_t k_at(int64_t b, int64_t j, int64_t g, int64_t stride) const {
    return (b * shape.kv_len() + j) * stride + g * shape.head_dim;
  }
  int64_t v_at(int64_t b, int64_t j, int64_t g, int64_t stride) const {
    return (b * shape.kv_len() + j) * stride + g * shape.v_dim();
  }
  int64_t o_at(int64_t b, int64_t i, int64_t h) const {
    return (b * shape.seq_q + i) * shape.o_stride() + h * shape.v_dim();
  }
  int64_t lse_at(int64_t b, int64_t h, int64_t i) const {
    return (b * shape.num_heads + h) * shape.seq_q + i;
  }
  int64_t group_of(int64_t h) const { return h / (shape.num_heads / shape.num_kv_heads); }
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
  const int64_t d = shape.head_dim, dv = shape.v_dim();
  const double scale = shape.scale();
  std::vector<double> scores(static_cast<size_t>(shape.kv_len())), acc(static_cast<size_t>(dv));
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.num_heads; ++h) {
      const int64_t g = ix.group_of(h);
      for (int64_t i = 0; i < shape.seq_q; ++i) {
        const float* qi = q + ix.q_at(b, i, h, shape.q_stride());
        const int64_t keys = shape.keys_attended(i);
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < keys; ++j) {
          scores[j] = scale * dot(qi, k + ix.k_at(b, j, g, shape.k_stride()), d);
          max_score = std::max(max_score, scores[j]);
        }
        double denominator = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < keys; ++j) {
          const double p = std::exp(scores[j] - max_score);
          denominator += p;
          const float* vj = v + ix.v_at(b, j, g, shape.v_stride());
          for (int64_t x = 0; x < dv; ++x) acc[x] += p * vj[x];
        }
        float* oi = o + ix.o_at(b, i, h);
        for (int64_t x = 0; x < dv; ++x) oi[x] = keys > 0 ? float(acc[x] / denominator) : 0.0f;
        lse[ix.lse_at(b, h, i)] =
            keys > 0 ? float(max_score + std::log(denominator)) : -std::numeric_limits<float>::infinity();
      }
    }
  }
}

void attention_backward(const AttentionShape& shape, const float* q, const float* k, const float* v,
                        const float* o, const float* lse, const float* d_o, float* dq, float* dk, float* dv) {
  validate_attention_shape(shape);
  const Indexer ix{shape};
  const int64_t d = shape.head_dim, d_v = shape.v_dim();
  const double scale = shape.scale();
  // dk and dv accumulate over the heads of a group and the queries: zero the slices first.
  for (int64_t b = 0; b < shape.batch; ++b)
    for (int64_t j = 0; j < shape.kv_len(); ++j)
      for (int64_t g = 0; g < shape.num_kv_heads; ++g) {
        std::fill_n(dk + ix.k_at(b, j, g, shape.dk_stride()), d, 0.0f);
        std::fill_n(dv + ix.v_at(b, j, g, shape.dv_stride()), d_v, 0.0f);
      }
  std::vector<double> dq_acc(static_cast<size_t>(d));
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.num_heads; ++h) {
      const int64_t g = ix.group_of(h);
      for (int64_t i = 0; i < shape.seq_q; ++i) {
        const float* qi = q + ix.q_at(b, i, h, shape.q_stride());
        const float* doi = d_o + ix.o_at(b, i, h);
        const double delta = dot(doi, o + ix.o_at(b, i, h), d_v);  // D_i = rowsum(dO o O)
        const double row_lse = lse[ix.lse_at(b, h, i)];
        std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
        for (int64_t j = 0; j < shape.keys_attended(i); ++j) {
          const float* kj = k + ix.k_at(b, j, g, shape.k_stride());
          const float* vj = v + ix.v_at(b, j, g, shape.v_stride());
          const double p = std::exp(scale * dot(qi, kj, d) - row_lse);
          const double ds = p * (dot(doi, vj, d_v) - delta);
          float* dvj = dv + ix.v_at(b, j, g, shape.dv_stride());
          float* dkj = dk + ix.k_at(b, j, g, shape.dk_stride());
          for (int64_t x = 0; x < d_v; ++x) dvj[x] += float(p * doi[x]);
          for (int64_t x = 0; x < d; ++x) {
            dkj[x] += float(scale * ds * qi[x]);
            dq_acc[x] += scale * ds * kj[x];
          }
        }
        float* dqi = dq + ix.q_at(b, i, h, shape.dq_stride());
        for (int64_t x = 0; x < d; ++x) dqi[x] = float(dq_acc[x]);
      }
    }
  }
}

}  // namespace megatune::executor::reference
