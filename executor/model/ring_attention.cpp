// RingAttention: context parallelism's p2p ring (forward, backward), on Backend
// kernels and Communicator transfers.
#include "executor/model/ring_attention.h"

#include <string>
#include <vector>

namespace megatune::executor {

using layouts::OpPhase;
using layouts::RingBlock;
using layouts::RingBlockSpan;
using layouts::RingPayload;

namespace {

constexpr layouts::OpRole kRing = layouts::OpRole::kContextParallelRing;

// A (rows, cols) contiguous view of a flat fp32 scratch.
Tensor flat_view(Tensor flat, std::int64_t rows, std::int64_t cols) {
  flat.rows = rows;
  flat.cols = cols;
  flat.row_stride = cols;
  return flat;
}

}  // namespace

AttentionShape ring_kernel_shape(const RingAttentionShape& shape, RingBlock block) {
  const RingBlockSpan span = layouts::ring_block_span(block, shape.local_seq);
  AttentionShape s;
  s.batch = block == RingBlock::kDiagonal ? shape.batch : 1;
  s.seq_q = span.queries;
  s.seq_kv = span.keys;
  s.num_heads = shape.heads;
  s.num_kv_heads = shape.kv_heads;
  s.head_dim = shape.head_dim;
  s.causal = span.causal;
  s.softmax_scale = shape.softmax_scale;
  s.q_token_stride = shape.q_width() + shape.kv_width();  // the packed qkv
  s.k_token_stride = s.v_token_stride = shape.kv_width();
  s.o_token_stride = s.dq_token_stride = shape.q_width();
  return s;
}

RingAttention::RingAttention(const RingAttentionShape& shape, DType dtype, Backend& backend,
                             Communicator& communicator)
    : shape_(shape), backend_(backend), communicator_(communicator) {
  cp_ = communicator_.size(CommGroup::kContext);
  cp_rank_ = communicator_.rank(CommGroup::kContext);
  next_rank_ = communicator_.global_rank(CommGroup::kContext, (cp_rank_ + 1) % cp_);
  prev_rank_ = communicator_.global_rank(CommGroup::kContext, (cp_rank_ + cp_ - 1) % cp_);
  storage_ = backend_.storage_bytes(dtype);
  const std::int64_t T = shape_.tokens();
  const char* what = "context-parallel ring (shared)";
  for (Tensor& t : ring_) t = backend_.allocate(dtype, 2 * T, shape_.kv_width(), what);
  block_out_ = backend_.allocate(dtype, T, shape_.q_width(), what);
  block_lse_ = backend_.allocate(DType::kFP32, 1, shape_.batch * shape_.heads * shape_.local_seq, what);
  half_lse_ = backend_.allocate(DType::kFP32, shape_.heads, shape_.local_seq / 2, what);
  dq_sum_ = backend_.allocate(dtype, T, shape_.q_width(), what);
  dq_block_ = backend_.allocate(dtype, T, shape_.q_width(), what);
  dkv_block_ = backend_.allocate(dtype, T, shape_.kv_width(), what);
}

Tensor RingAttention::rows(Tensor t, std::int64_t first, std::int64_t count) const {
  const std::int64_t bytes = t.dtype == DType::kFP32 ? 4 : storage_;
  if (t.data != nullptr) t.data = static_cast<char*>(t.data) + first * t.row_stride * bytes;
  t.rows = count;
  return t;
}

Tensor RingAttention::cols(Tensor t, std::int64_t first, std::int64_t count) const {
  return columns_of(t, first, count, t.dtype == DType::kFP32 ? 4 : storage_);
}

AttentionArgs RingAttention::block_args(Tensor q, Tensor kv, std::int64_t batch, std::int64_t queries,
                                        std::int64_t keys, bool causal) const {
  const std::int64_t kv_heads_width = shape_.kv_heads * shape_.head_dim;
  AttentionArgs a;
  a.q = cols(q, 0, shape_.q_width());
  a.k = cols(kv, 0, kv_heads_width);
  a.v = cols(kv, kv_heads_width, kv_heads_width);
  a.batch = batch;
  a.seq_q = queries;
  a.seq_kv = keys;
  a.heads = shape_.heads;
  a.kv_heads = shape_.kv_heads;
  a.head_dim = shape_.head_dim;
  a.head_dim_v = shape_.head_dim;
  a.causal = causal;
  a.softmax_scale = shape_.softmax_scale;
  return a;
}

CommHandle RingAttention::post(Tensor send, Tensor recv, bool backward, const char* send_label,
                               const char* recv_label, int layer, OpPhase phase) {
  // Forward: K,V towards the next CP rank; backward the other way round
  // (TransformerEngine's directions).
  P2pTransferArgs out, in;
  out.send = true;
  out.tensor = send;
  out.peer_rank = backward ? prev_rank_ : next_rank_;
  out.tag = {send_label, layer, phase, kRing};
  in.send = false;
  in.tensor = recv;
  in.peer_rank = backward ? next_rank_ : prev_rank_;
  in.tag = {recv_label, layer, phase, kRing};
  out.microbatch = in.microbatch = -2;  // the recorder's schedule position
  out.chunk = in.chunk = -2;
  return communicator_.batch_p2p_async(CommGroup::kContext, {out, in});
}

void RingAttention::block_forward(Tensor qkv, Tensor kv, RingBlock block, int layer, OpPhase phase) {
  // The block's partial output and log-sum-exp into the scratch; the half
  // blocks per sequence (no one batch stride covers every sequence's half).
  const std::int64_t s = shape_.local_seq;
  const RingBlockSpan span = layouts::ring_block_span(block, s);
  const Tensor lse = flat_view(block_lse_, shape_.batch * shape_.heads, span.queries);
  for (std::int64_t b = 0; b < shape_.batch; ++b) {
    AttentionArgs a =
        block_args(rows(qkv, b * s + span.query_begin, span.queries),
                   rows(kv, b * s + span.key_begin, span.keys), 1, span.queries, span.keys, false);
    a.out = rows(block_out_, b * span.queries, span.queries);
    a.lse = rows(lse, b * shape_.heads, shape_.heads);
    backend_.attention_forward(a, {"attn", layer, phase});
  }
}

void RingAttention::forward(Tensor qkv, Tensor out, Tensor lse, Tensor kv_last, int layer, OpPhase phase) {
  const std::int64_t T = shape_.tokens(), s = shape_.local_seq;
  Tensor held = rows(ring_[0], 0, T);
  backend_.cast(cols(qkv, shape_.q_width(), shape_.kv_width()), held, {"cp_kv_pack", layer, phase});
  for (int step = 0; step < cp_; ++step) {
    const bool last_transfer = step + 2 == cp_;
    const Tensor next = last_transfer ? kv_last : rows(ring_[(step + 1) % 2], 0, T);
    CommHandle transfer;
    if (layouts::ring_forward_payload(cp_, step) == RingPayload::kKv)
      transfer = post(held, next, false, "cp_kv_send", "cp_kv_recv", layer, phase);
    const RingBlock block =
        layouts::ring_block(cp_rank_, layouts::ring_forward_key_rank(cp_, cp_rank_, step));
    if (block == RingBlock::kDiagonal) {
      AttentionArgs a = block_args(qkv, held, shape_.batch, s, s, true);
      a.out = out;
      a.lse = lse;
      backend_.attention_forward(a, {"attn", layer, phase});
    } else {
      block_forward(qkv, held, block, layer, phase);
      AttentionMergeArgs m;
      m.shape = {shape_.batch, s, shape_.heads, shape_.head_dim, 0, 0, 0};
      const RingBlockSpan span = layouts::ring_block_span(block, s);
      m.shape.query_begin = span.query_begin;
      m.shape.queries = span.queries;
      m.out = out;
      m.lse = lse;
      m.block_out = rows(block_out_, 0, shape_.batch * span.queries);
      m.block_lse = flat_view(block_lse_, shape_.batch * shape_.heads, span.queries);
      backend_.attention_merge(m, {"cp_attn_merge", layer, phase});
    }
    if (transfer) transfer->wait();
    held = next;
  }
}

void RingAttention::block_backward(Tensor qkv, Tensor kv, Tensor out, Tensor lse, Tensor d_out,
                                   RingBlock block, int layer) {
  // The block's dQ into dq_block_ (its queries' rows per sequence, back to
  // back) and dK,dV into dkv_block_ (its keys' rows likewise), from the merged
  // output and log-sum-exp.
  const std::int64_t s = shape_.local_seq, kvh = shape_.kv_heads * shape_.head_dim;
  const RingBlockSpan span = layouts::ring_block_span(block, s);
  const bool whole = block == RingBlock::kDiagonal;
  for (std::int64_t b = 0; b < (whole ? 1 : shape_.batch); ++b) {
    const std::int64_t batch = whole ? shape_.batch : 1, q0 = b * s + span.query_begin;
    AttentionArgs a =
        block_args(rows(qkv, q0, batch * span.queries), rows(kv, b * s + span.key_begin, batch * span.keys),
                   batch, span.queries, span.keys, span.causal);
    a.out = rows(out, q0, batch * span.queries);
    a.lse = rows(lse, b * shape_.heads, batch * shape_.heads);
    if (span.queries != s) {  // the second half's log-sum-exp, contiguous as the kernels read it
      backend_.copy(cols(a.lse, span.query_begin, span.queries), half_lse_);
      a.lse = half_lse_;
    }
    AttentionGrads g;
    g.d_out = rows(d_out, q0, batch * span.queries);
    g.dq = rows(dq_block_, b * span.queries, batch * span.queries);
    const Tensor dkv = rows(dkv_block_, b * span.keys, batch * span.keys);
    g.dk = cols(dkv, 0, kvh);
    g.dv = cols(dkv, kvh, kvh);
    backend_.attention_backward(a, g, {"attn", layer, OpPhase::kBackward});
  }
}

void RingAttention::backward(Tensor qkv, Tensor out, Tensor lse, Tensor kv_last, Tensor d_out, Tensor d_qkv,
                             int layer) {
  const std::int64_t T = shape_.tokens(), s = shape_.local_seq;
  const OpPhase kB = OpPhase::kBackward;
  backend_.fill_zero(dq_sum_);
  Tensor held = kv_last, held_dkv;  // the held K,V block and the dK,dV partial
                                    // sum that came with it
  for (int step = 0; step < cp_; ++step) {
    Tensor& next = ring_[(step + 1) % 2];
    const Tensor next_kv = rows(next, 0, T), next_dkv = rows(next, T, T);
    if (step == 0) backend_.fill_zero(next_dkv);  // the first block's sum starts here
    CommHandle transfer;
    switch (layouts::ring_backward_payload(cp_, step)) {
      case RingPayload::kKv:
        transfer = post(held, next_kv, true, "cp_kv_send", "cp_kv_recv", layer, kB);
        break;
      case RingPayload::kKvAndDkv:
        transfer = post(ring_[step % 2], next, true, "cp_kv_dkv_send", "cp_kv_dkv_recv", layer, kB);
        break;
      case RingPayload::kDkv:
        transfer = post(held_dkv, next_dkv, true, "cp_dkv_send", "cp_dkv_recv", layer, kB);
        break;
      case RingPayload::kNone:
        break;
    }
    const RingBlock block =
        layouts::ring_block(cp_rank_, layouts::ring_backward_key_rank(cp_, cp_rank_, step));
    block_backward(qkv, held, out, lse, d_out, block, layer);
    if (transfer) transfer->wait();
    const RingBlockSpan span = layouts::ring_block_span(block, s);
    backend_.add_rows(dq_sum_, rows(dq_block_, 0, shape_.batch * span.queries), s, span.query_begin,
                      {"cp_dq_add", layer, kB});
    backend_.add_rows(next_dkv, rows(dkv_block_, 0, shape_.batch * span.keys), s, span.key_begin,
                      {"cp_dkv_add", layer, kB});
    held = next_kv;
    held_dkv = next_dkv;
  }
  backend_.cast(dq_sum_, cols(d_qkv, 0, shape_.q_width()), {"cp_dq_unpack", layer, kB});
  backend_.cast(held_dkv, cols(d_qkv, shape_.q_width(), shape_.kv_width()), {"cp_dkv_unpack", layer, kB});
}

}  // namespace megatune::executor
