// OpPricer: what the simulator asks of a cost model (an interface, so tests can inject a stub), and the
// adapter over the cost_models::CostModel facade.
#pragma once
#include <cstdint>

#include "cost_models/cost_model.h"
#include "cost_models/op_cost.h"
#include "layouts/op.h"

namespace megatune::planner {

class OpPricer {
 public:
  virtual ~OpPricer() = default;
  // Time of one op. For communication, `group` is the ranks it spans and over how many nodes.
  virtual cost_models::OpCost price(const layouts::Op& op,
                                    const cost_models::CollectiveGroup& group) const = 0;
  virtual int gpus_per_node() const = 0;
  virtual double peak_bf16_tflops() const = 0;             // dense, per GPU: the MFU denominator
  virtual std::int64_t memory_capacity_bytes() const = 0;  // per GPU
};

// Prices through a CostModel (which caches and is safe to share between threads).
class CostModelPricer final : public OpPricer {
 public:
  explicit CostModelPricer(const cost_models::CostModel& model) : model_(model) {}
  cost_models::OpCost price(const layouts::Op& op, const cost_models::CollectiveGroup& group) const override {
    return model_.price(op, group);
  }
  int gpus_per_node() const override { return model_.cluster().gpus_per_node; }
  double peak_bf16_tflops() const override { return model_.gpu().peak_bf16_tflops; }
  std::int64_t memory_capacity_bytes() const override { return model_.gpu().memory_bytes; }
  const cost_models::CostModel& cost_model() const { return model_; }

 private:
  const cost_models::CostModel& model_;
};

}  // namespace megatune::planner
