// Flash attention (CUDA) for every compiled head dim against the CPU reference: (q/k, v) head dims 64, 80,
// 96, 128, 192/128 (MLA) and 256; causal and not, GQA, seq_q != seq_kv, causal offsets (bottom-right
// alignment, queries that attend no key), q, k, v, o, dq, dk, dv each with a token stride of its own, and
// self-attention with the packed qkv strides (the shapes the Hopper wgmma kernels take: every head dim's
// forward, 192 / 128's included, and every backward but 192 / 128's); o, lse, dq, dk, dv, for the default
// kernels and the mma.sync variants.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "executor/cuda/flash_attention.h"
#include "executor/kernels/reference_attention.h"
#include "tests/executor/kernel_gpu_test_util.h"

namespace megatune::executor {
namespace {

using cuda::bf16;
using test::DeviceBuffer;

struct Case {
  int64_t head_dim, head_dim_v;
  int64_t batch, seq_q, seq_kv, heads, kv_heads;
  bool causal;
  int64_t causal_offset;
  bool packed_strides = false;  // every stride the packed qkv's (k and v, dk and dv alike)
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "d" << c.head_dim << "_v" << c.head_dim_v << "_b" << c.batch << "_q" << c.seq_q << "_kv" << c.seq_kv
      << "_h" << c.heads << "_g" << c.kv_heads << (c.causal ? "_causal" : "_full") << "_off"
      << c.causal_offset << (c.packed_strides ? "_packed" : "");
}

AttentionShape shape_of(const Case& c) {
  AttentionShape s{.batch = c.batch,
                   .seq_q = c.seq_q,
                   .seq_kv = c.seq_kv,
                   .num_heads = c.heads,
                   .num_kv_heads = c.kv_heads,
                   .head_dim = c.head_dim,
                   .head_dim_v = c.head_dim_v,
                   .causal = c.causal,
                   .causal_offset = c.causal_offset};
  if (c.packed_strides) return s;
  // Every tensor its own stride (padding of 0-24 elements; multiples of 8 as the kernels need).
  s.q_token_stride = c.heads * c.head_dim + 8;
  s.k_token_stride = c.kv_heads * c.head_dim + 16;
  s.v_token_stride = c.kv_heads * c.head_dim_v + 8;
  s.o_token_stride = c.heads * c.head_dim_v;
  s.dq_token_stride = c.heads * c.head_dim + 24;
  s.dk_token_stride = c.kv_heads * c.head_dim;
  s.dv_token_stride = c.kv_heads * c.head_dim_v + 8;
  return s;
}

// Relative error over the first `width` columns of each `stride`-element token row.
double columns_error(const std::vector<float>& got, const std::vector<float>& want, int64_t stride,
                     int64_t width) {
  return test::relative_error(got, want, [&](size_t i) { return int64_t(i) % stride < width; });
}

// lse: -inf exactly where the reference has it (queries without keys), else within 2e-2.
void expect_lse(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  double max_error = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i])) {
      EXPECT_TRUE(std::isinf(got[i]) && got[i] < 0) << what << ": lse " << i << " = " << got[i];
    } else {
      max_error = std::max(max_error, double(std::abs(got[i] - want[i])));
    }
  }
  EXPECT_LT(max_error, 2e-2) << what << ": lse";
}

class FlashAttentionShapesGpu : public ::testing::TestWithParam<Case> {};

TEST_P(FlashAttentionShapesGpu, MatchesReferenceForwardAndBackward) {
  MEGATUNE_REQUIRE_GPU();
  const Case c = GetParam();
  const AttentionShape s = shape_of(c);
  ASSERT_TRUE(cuda::flash_attention_supports(s)) << cuda::flash_attention_unsupported(s);
  const int64_t tq = c.batch * c.seq_q, tkv = c.batch * c.seq_kv;
  const auto q = test::random_bf16_values(tq * s.q_stride(), 1);
  const auto k = test::random_bf16_values(tkv * s.k_stride(), 2);
  const auto v = test::random_bf16_values(tkv * s.v_stride(), 3);
  const auto d_o = test::random_bf16_values(tq * s.o_stride(), 4);
  std::vector<float> o_ref(tq * s.o_stride()), lse_ref(c.batch * c.heads * c.seq_q);
  reference::attention_forward(s, q.data(), k.data(), v.data(), o_ref.data(), lse_ref.data());

  DeviceBuffer<bf16> q_dev(q.size()), k_dev(k.size()), v_dev(v.size()), o_dev(o_ref.size()),
      do_dev(d_o.size());
  DeviceBuffer<float> lse_dev(lse_ref.size());
  test::upload_bf16(q_dev, q);
  test::upload_bf16(k_dev, k);
  test::upload_bf16(v_dev, v);
  test::upload_bf16(do_dev, d_o);
  const int64_t o_width = c.heads * c.head_dim_v;
  // The default forward, then the mma.sync variants (16 and 32 query rows per warp).
  for (const int rows_per_warp : {0, 16, 32}) {
    const std::string what = rows_per_warp == 0 ? "default forward" : std::to_string(rows_per_warp) + " rows";
    o_dev.poison();
    lse_dev.poison();
    if (rows_per_warp == 0) {
      cuda::flash_attention_forward(s, q_dev.get(), k_dev.get(), v_dev.get(), o_dev.get(), lse_dev.get(),
                                    nullptr);
    } else {
      cuda::flash_attention_forward_variant(s, q_dev.get(), k_dev.get(), v_dev.get(), o_dev.get(),
                                            lse_dev.get(), nullptr, rows_per_warp);
    }
    MEGATUNE_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LT(columns_error(test::download_bf16(o_dev), o_ref, s.o_stride(), o_width), 1e-2) << what;
    expect_lse(test::download(lse_dev), lse_ref, what);
  }
  cuda::flash_attention_forward(s, q_dev.get(), k_dev.get(), v_dev.get(), o_dev.get(), lse_dev.get(),
                                nullptr);

  // Backward from the GPU's o and lse against the reference backward, into strided dq, dk, dv.
  std::vector<float> dq_ref(tq * s.dq_stride()), dk_ref(tkv * s.dk_stride()), dv_ref(tkv * s.dv_stride());
  reference::attention_backward(s, q.data(), k.data(), v.data(), o_ref.data(), lse_ref.data(), d_o.data(),
                                dq_ref.data(), dk_ref.data(), dv_ref.data());
  DeviceBuffer<unsigned char> workspace(cuda::flash_attention_backward_workspace_bytes(s));
  for (const bool longest_first : {true, false}) {
    const std::string what = longest_first ? "default backward" : "mma.sync backward, key blocks in order";
    DeviceBuffer<bf16> dq_dev(dq_ref.size()), dk_dev(dk_ref.size()), dv_dev(dv_ref.size());
    dq_dev.poison();
    dk_dev.poison();
    dv_dev.poison();
    if (longest_first) {
      cuda::flash_attention_backward(s, q_dev.get(), k_dev.get(), v_dev.get(), o_dev.get(), lse_dev.get(),
                                     do_dev.get(), dq_dev.get(), dk_dev.get(), dv_dev.get(), workspace.get(),
                                     workspace.size(), nullptr);
    } else {
      cuda::flash_attention_backward_variant(s, q_dev.get(), k_dev.get(), v_dev.get(), o_dev.get(),
                                             lse_dev.get(), do_dev.get(), dq_dev.get(), dk_dev.get(),
                                             dv_dev.get(), workspace.get(), workspace.size(), nullptr,
                                             cuda::BackwardVariant{64, false, false});
    }
    MEGATUNE_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LT(columns_error(test::download_bf16(dq_dev), dq_ref, s.dq_stride(), c.heads * c.head_dim), 2e-2)
        << "dq, " << what;
    EXPECT_LT(columns_error(test::download_bf16(dk_dev), dk_ref, s.dk_stride(), c.kv_heads * c.head_dim),
              2e-2)
        << "dk, " << what;
    EXPECT_LT(columns_error(test::download_bf16(dv_dev), dv_ref, s.dv_stride(), c.kv_heads * c.head_dim_v),
              2e-2)
        << "dv, " << what;
  }
}

std::vector<Case> every_head_dim() {
  std::vector<Case> cases;
  for (const auto& [d, dv] :
       {std::pair<int64_t, int64_t>{64, 64}, {80, 80}, {96, 96}, {128, 128}, {192, 128}, {256, 256}}) {
    cases.push_back({d, dv, 2, 200, 200, 4, 2, true, 0});         // causal self-attention, GQA
    cases.push_back({d, dv, 1, 100, 300, 4, 1, false, 0});        // fewer queries than keys, no mask
    cases.push_back({d, dv, 1, 128, 320, 2, 2, true, 192});       // bottom-right alignment (seq_kv - seq_q)
    cases.push_back({d, dv, 1, 150, 90, 2, 1, true, -40});        // the first 40 queries attend no key
    cases.push_back({d, dv, 2, 64, 64, 2, 2, true, 30});          // a later query block (diagonal mid-tile)
    cases.push_back({d, dv, 2, 200, 200, 4, 2, true, 0, true});   // self-attention, packed strides
    cases.push_back({d, dv, 1, 300, 300, 2, 1, false, 0, true});  // the same without a mask
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(HeadDims, FlashAttentionShapesGpu, ::testing::ValuesIn(every_head_dim()));

TEST(FlashAttentionShapesGpuApi, UncompiledHeadDimsAreRefusedWithTheReason) {
  AttentionShape shape{.batch = 1, .seq_q = 16, .num_heads = 2, .num_kv_heads = 1, .head_dim = 72};
  EXPECT_FALSE(cuda::flash_attention_supports(shape));
  EXPECT_NE(cuda::flash_attention_unsupported(shape).find("head dim 72"), std::string::npos);
  EXPECT_THROW(cuda::flash_attention_forward(shape, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr),
               std::invalid_argument);
  shape.head_dim = 192;
  EXPECT_FALSE(cuda::flash_attention_supports(shape)) << "192 is compiled with v head dim 128 only";
  shape.head_dim_v = 128;
  EXPECT_TRUE(cuda::flash_attention_supports(shape));
  shape.v_token_stride = 2 * 128 + 4;  // not a multiple of 8
  EXPECT_FALSE(cuda::flash_attention_supports(shape));
}

}  // namespace
}  // namespace megatune::executor
