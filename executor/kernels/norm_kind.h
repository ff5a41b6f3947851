// NormKind: which normalization a transformer uses (Megatron's --normalization LayerNorm | RMSNorm).
#pragma once

namespace megatune::executor {

enum class NormKind { kLayerNorm, kRMSNorm };

}  // namespace megatune::executor
