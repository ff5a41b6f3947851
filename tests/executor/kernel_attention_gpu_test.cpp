// Flash attention (CUDA) against the CPU reference for the shapes the Hopper wgmma kernels take: head dims
// 64, 80, 96 (tiles zero-padded to 128), 128 and 256, causal and not, GQA, sequence lengths
// that are not multiples of the tiles, packed qkv and separate layouts, forward (o, lse) and backward, every
// kernel variant; the variants a head dim has no kernel for are refused.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <tuple>

#include "executor/cuda/flash_attention.h"
#include "executor/kernels/reference_attention.h"
#include "tests/executor/kernel_gpu_test_util.h"

namespace megatune::executor {
namespace {

using cuda::bf16;
using test::DeviceBuffer;

struct Case {
  int64_t batch, seq, heads, kv_heads, head_dim;
  bool causal;
  bool packed;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "b" << c.batch << "_s" << c.seq << "_h" << c.heads << "_kv" << c.kv_heads << "_d" << c.head_dim
      << (c.causal ? "_causal" : "_full") << (c.packed ? "_packed" : "_separate");
}

// Whether a head dim has the forward variant: every one has the mma.sync kernels; 64 and 128 every wgmma
// form; 80 and 96 the warp-specialized one; 256 the warp-specialized one without the ping-pong.
bool forward_variant_exists(int64_t d, int rows_per_warp, bool warp_specialized, bool ping_pong) {
  if (rows_per_warp != 64 || d == 64 || d == 128) return true;
  return warp_specialized && (d != 256 || !ping_pong);
}

// The same for the backward: 80 and 96 take the warp-specialized wgmma kernel with bulk dQ, 256 the
// warp-specialized (wide) one with dQ atomics, both with 2 stages; 128 key rows per mma.sync block take 64
// and 128 only.
bool backward_variant_exists(int64_t d, const cuda::BackwardVariant& v) {
  if (d == 64 || d == 128) return true;
  if (!v.wgmma) return v.key_rows_per_block == 64;
  const auto dq = d == 256 ? cuda::WgmmaDq::kAtomics : cuda::WgmmaDq::kBulkTiles;
  return v.wgmma_warp_specialized && v.wgmma_dq == dq && v.wgmma_ws_stages == 2;
}

class FlashAttentionGpu : public ::testing::TestWithParam<Case> {};

TEST_P(FlashAttentionGpu, MatchesReferenceForwardAndBackward) {
  MEGATUNE_REQUIRE_GPU();
  const Case c = GetParam();
  AttentionShape shape{.batch = c.batch,
                       .seq_q = c.seq,
                       .num_heads = c.heads,
                       .num_kv_heads = c.kv_heads,
                       .head_dim = c.head_dim,
                       .causal = c.causal};
  const int64_t tokens = c.batch * c.seq, d = c.head_dim;
  if (!c.packed) {  // separate q [b,s,n_q,d], k/v [b,s,n_kv,d] (k and v in one buffer, kv stride padded)
    shape.q_token_stride = c.heads * d;
    shape.k_token_stride = shape.v_token_stride = 2 * c.kv_heads * d + 8;
  }
  ASSERT_TRUE(cuda::flash_attention_supports(shape));
  // One host buffer for q, one for k|v, laid out with the strides above.
  const int64_t q_elems = tokens * shape.q_stride(), kv_elems = tokens * shape.k_stride();
  std::vector<float> q_host = test::random_bf16_values(q_elems, 1);
  std::vector<float> kv_host = c.packed ? q_host : test::random_bf16_values(kv_elems, 2);
  const float* q_ptr = q_host.data();
  const float* k_ptr = c.packed ? q_host.data() + shape.packed_k_offset() : kv_host.data();
  const float* v_ptr = c.packed ? q_host.data() + shape.packed_v_offset() : kv_host.data() + c.kv_heads * d;

  const int64_t o_elems = tokens * c.heads * d, lse_elems = c.batch * c.heads * c.seq;
  std::vector<float> o_ref(o_elems), lse_ref(lse_elems);
  reference::attention_forward(shape, q_ptr, k_ptr, v_ptr, o_ref.data(), lse_ref.data());

  DeviceBuffer<bf16> q_dev(q_elems), kv_dev(c.packed ? 1 : kv_elems), o_dev(o_elems), do_dev(o_elems);
  DeviceBuffer<float> lse_dev(lse_elems);
  test::upload_bf16(q_dev, q_host);
  if (!c.packed) test::upload_bf16(kv_dev, kv_host);
  const bf16* q_d = q_dev.get();
  const bf16* k_d = c.packed ? q_dev.get() + shape.packed_k_offset() : kv_dev.get();
  const bf16* v_d = c.packed ? q_dev.get() + shape.packed_v_offset() : kv_dev.get() + c.kv_heads * d;
  o_dev.poison();
  lse_dev.poison();
  cuda::flash_attention_forward(shape, q_d, k_d, v_d, o_dev.get(), lse_dev.get(), nullptr);
  MEGATUNE_CUDA_CHECK(cudaDeviceSynchronize());
  const auto o_got = test::download_bf16(o_dev);
  const auto lse_got = test::download(lse_dev);
  EXPECT_LT(test::relative_error(o_got, o_ref), 1e-2);
  double max_lse_error = 0;
  for (int64_t i = 0; i < lse_elems; ++i)
    max_lse_error = std::max(max_lse_error, double(std::abs(lse_got[i] - lse_ref[i])));
  EXPECT_LT(max_lse_error, 2e-2) << "lse";
  EXPECT_FALSE(std::isnan(max_lse_error));

  // The other forward variants (mma.sync with 16 and 32 rows per warp; wgmma with one and two warpgroups
  // per block) compute the same function.
  // Warp-specialized: 2 or 3 (head dim 64) consumer warpgroups, with and without the ping-pong.
  for (const auto& [rows_per_warp, warpgroups, warp_specialized, ping_pong] :
       {std::tuple{16, 0, false, false},
        {32, 0, false, false},
        {64, 1, false, false},
        {64, 2, false, false},
        {64, 2, true, false},
        {64, 2, true, true},
        {64, d == 64 ? 3 : 2, true, false},
        {64, d == 64 ? 3 : 2, true, true}}) {
    DeviceBuffer<bf16> o_variant(o_elems);
    DeviceBuffer<float> lse_variant(lse_elems);
    o_variant.poison();
    lse_variant.poison();
    if (!forward_variant_exists(d, rows_per_warp, warp_specialized, ping_pong)) {
      EXPECT_THROW(cuda::flash_attention_forward_variant(shape, q_d, k_d, v_d, o_variant.get(),
                                                         lse_variant.get(), nullptr, rows_per_warp,
                                                         warpgroups, warp_specialized, ping_pong),
                   std::invalid_argument)
          << "head dim " << d << ", wgmma warpgroups " << warpgroups << ", warp-specialized "
          << warp_specialized << ", ping-pong " << ping_pong;
      continue;
    }
    cuda::flash_attention_forward_variant(shape, q_d, k_d, v_d, o_variant.get(), lse_variant.get(), nullptr,
                                          rows_per_warp, warpgroups, warp_specialized, ping_pong);
    MEGATUNE_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LT(test::relative_error(test::download_bf16(o_variant), o_ref), 1e-2)
        << "rows_per_warp " << rows_per_warp << ", warpgroups " << warpgroups << ", warp-specialized "
        << warp_specialized << ", ping-pong " << ping_pong;
    EXPECT_LT(test::relative_error(test::download(lse_variant), lse_ref), 1e-3)
        << "rows_per_warp " << rows_per_warp << ", warpgroups " << warpgroups << ", warp-specialized "
        << warp_specialized << ", ping-pong " << ping_pong;
  }

  // Backward from the GPU's own o and lse (as the engine will run it), against the reference backward.
  const auto d_o = test::random_bf16_values(o_elems, 3);
  test::upload_bf16(do_dev, d_o);
  std::vector<float> dq_ref(q_elems, 0.0f), dkv_ref(c.packed ? q_elems : kv_elems, 0.0f);
  float* dq_r = dq_ref.data();
  float* dk_r = c.packed ? dq_ref.data() + shape.packed_k_offset() : dkv_ref.data();
  float* dv_r = c.packed ? dq_ref.data() + shape.packed_v_offset() : dkv_ref.data() + c.kv_heads * d;
  reference::attention_backward(shape, q_ptr, k_ptr, v_ptr, o_ref.data(), lse_ref.data(), d_o.data(), dq_r,
                                dk_r, dv_r);
  // Every variant of the main pass (the default is one of them).
  for (const cuda::BackwardVariant variant :
       {cuda::BackwardVariant{}, cuda::BackwardVariant{64, true, true, 1, cuda::WgmmaDq::kAtomics, false},
        cuda::BackwardVariant{64, true, true, 2, cuda::WgmmaDq::kAtomics, false},
        cuda::BackwardVariant{64, true, true, 2, cuda::WgmmaDq::kBulkTiles, false},
        cuda::BackwardVariant{64, true, true, 0, cuda::WgmmaDq::kAtomics, true},
        cuda::BackwardVariant{64, true, true, 0, cuda::WgmmaDq::kAtomics, true, 3},
        cuda::BackwardVariant{64, true, true, 0, cuda::WgmmaDq::kBulkTiles, true},
        cuda::BackwardVariant{64, false, false}, cuda::BackwardVariant{64, true, false},
        cuda::BackwardVariant{128, false, false}, cuda::BackwardVariant{128, true, false}}) {
    const std::string name =
        variant.wgmma
            ? "wgmma, " + std::to_string(variant.wgmma_warpgroups) + " warpgroups per block" +
                  (variant.wgmma_dq == cuda::WgmmaDq::kBulkTiles ? ", bulk dQ tiles" : "") +
                  (variant.wgmma_warp_specialized
                       ? ", warp-specialized, " + std::to_string(variant.wgmma_ws_stages) + " stages"
                       : "")
            : std::to_string(variant.key_rows_per_block) + " key rows per block" +
                  (variant.longest_first ? ", longest first" : "");
    DeviceBuffer<bf16> dq_dev(q_elems), dkv_dev(c.packed ? 1 : kv_elems);
    dq_dev.poison();
    dkv_dev.poison();
    bf16* dq_d = dq_dev.get();
    bf16* dk_d = c.packed ? dq_dev.get() + shape.packed_k_offset() : dkv_dev.get();
    bf16* dv_d = c.packed ? dq_dev.get() + shape.packed_v_offset() : dkv_dev.get() + c.kv_heads * d;
    DeviceBuffer<unsigned char> workspace(cuda::flash_attention_backward_workspace_bytes(shape));
    if (!backward_variant_exists(d, variant)) {
      EXPECT_THROW(cuda::flash_attention_backward_variant(shape, q_d, k_d, v_d, o_dev.get(), lse_dev.get(),
                                                          do_dev.get(), dq_d, dk_d, dv_d, workspace.get(),
                                                          workspace.size(), nullptr, variant),
                   std::invalid_argument)
          << "head dim " << d << ", " << name;
      continue;
    }
    cuda::flash_attention_backward_variant(shape, q_d, k_d, v_d, o_dev.get(), lse_dev.get(), do_dev.get(),
                                           dq_d, dk_d, dv_d, workspace.get(), workspace.size(), nullptr,
                                           variant);
    MEGATUNE_CUDA_CHECK(cudaDeviceSynchronize());
    const auto dq_got = test::download_bf16(dq_dev);
    // Compare each of dq, dk, dv on its own slice of the strided buffers.
    auto slice = [&](const std::vector<float>& buffer, int64_t stride, int64_t offset, int64_t width) {
      std::vector<float> out;
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t x = 0; x < width; ++x) out.push_back(buffer[t * stride + offset + x]);
      return out;
    };
    const int64_t q_width = c.heads * d, kv_width = c.kv_heads * d;
    EXPECT_LT(test::relative_error(slice(dq_got, shape.q_stride(), 0, q_width),
                                   slice(dq_ref, shape.q_stride(), 0, q_width)),
              2e-2)
        << "dq, " << name;
    const auto dkv_got = c.packed ? dq_got : test::download_bf16(dkv_dev);
    const auto& dkv_want = c.packed ? dq_ref : dkv_ref;
    const int64_t k_off = c.packed ? shape.packed_k_offset() : 0;
    const int64_t v_off = c.packed ? shape.packed_v_offset() : kv_width;
    EXPECT_LT(test::relative_error(slice(dkv_got, shape.k_stride(), k_off, kv_width),
                                   slice(dkv_want, shape.k_stride(), k_off, kv_width)),
              2e-2)
        << "dk, " << name;
    EXPECT_LT(test::relative_error(slice(dkv_got, shape.k_stride(), v_off, kv_width),
                                   slice(dkv_want, shape.k_stride(), v_off, kv_width)),
              2e-2)
        << "dv, " << name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FlashAttentionGpu,
    ::testing::Values(Case{2, 128, 2, 2, 64, true, true}, Case{2, 128, 2, 2, 128, false, true},
                      Case{1, 77, 4, 2, 64, true, true}, Case{1, 77, 4, 1, 128, true, false},
                      Case{2, 200, 4, 2, 128, true, true}, Case{1, 200, 4, 4, 64, false, false},
                      Case{1, 1, 2, 1, 128, true, true}, Case{1, 300, 8, 2, 128, false, true},
                      Case{1, 257, 2, 1, 64, true, false}, Case{2, 640, 4, 1, 128, true, true},
                      Case{1, 1000, 2, 2, 64, true, false}, Case{1, 384, 2, 2, 64, false, true},
                      Case{2, 200, 4, 2, 80, true, true}, Case{1, 300, 4, 1, 80, false, false},
                      Case{1, 77, 2, 2, 80, true, false}, Case{2, 257, 4, 2, 96, true, false},
                      Case{1, 300, 8, 2, 96, false, true}, Case{1, 640, 2, 1, 96, true, true},
                      Case{2, 200, 4, 2, 256, true, true}, Case{1, 130, 2, 1, 256, false, false},
                      Case{1, 77, 2, 2, 256, true, false}));

TEST(FlashAttentionGpuApi, WorkspaceCoversTheDqAccumulator) {
  AttentionShape shape{.batch = 1, .seq_q = 16, .num_heads = 2, .num_kv_heads = 1, .head_dim = 64};
  EXPECT_TRUE(cuda::flash_attention_supports(shape));
  EXPECT_GT(cuda::flash_attention_backward_workspace_bytes(shape), size_t(16 * 2 * 64 * 4));
  // Head dim 80: dQ's tiles are 128 columns wide (64 rows of the padded sequence, 2 heads, fp32).
  shape.head_dim = 80;
  EXPECT_GE(cuda::flash_attention_backward_workspace_bytes(shape), size_t(64 * 2 * 128 * 4));
}

}  // namespace
}  // namespace megatune::executor
