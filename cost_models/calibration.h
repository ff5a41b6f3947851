// Calibration: corrections fitted from traced training runs (measured op times against the cost model's own
// prices of the same ops) and applied on top of the per-op models.
//
// Per op class (gemm, attention_fwd, attention_bwd, each memory-bound kind, and "memory_bound" pooled over
// all of them for kinds without samples of their own), log(measured / predicted) is a linear function of the
// op's shape features:
//   gemm           log FLOPs, log arithmetic intensity (FLOPs per byte of A, B and C)
//   attention_*    log FLOPs, log head_dim
//   memory-bound   log bytes
// fitted by least squares weighted by the predicted time, with a ridge penalty on the slopes (a class whose
// samples are all of one shape gets a plain factor), the intercept then set so that the class's corrected
// total equals its measured total; centred at the samples' weighted mean and with every feature clamped to
// the fitted range when applied: an unseen shape gets the correction of the nearest fitted one, never an
// extrapolation. So the correction carries the training condition (sustained clocks under the power cap,
// kernels back to back) and the shape dependence the isolated-kernel profile misses.
// On top of the class correction, each shape seen in the traced runs keeps its own residual (measured over
// class-corrected time, shrunk towards 1 when seen rarely): the step's kernels as they ran in training, for
// the shapes a run has already executed; shapes never traced get the class correction alone.
// Besides: the mean idle time of the compute stream per compute op in a step (host work and launch gaps
// between kernels, and work the step program does not list), added to every compute op's price.
// Communication is not corrected (its measured time includes waiting for the peers).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "cost_models/op_cost.h"
#include "layouts/op.h"

namespace megatune::cost_models {

// One measured op: its uncalibrated price and its measured time (mean over the traced iterations).
struct CalibrationSample {
  layouts::Op op;
  double predicted_s = 0;
  double measured_s = 0;
};

// The correction of one op class: factor = exp(log_intercept + sum_i slope_i * (clamp(x_i) - centre_i)).
struct CorrectionClass {
  std::string name;  // "gemm", "attention_fwd", "attention_bwd", "norm", ..., "memory_bound"
  double log_intercept = 0;
  std::vector<double> slopes, centres, lows, highs;  // per feature (correction_feature_names)
  int ops = 0;                                       // samples fitted
  double predicted_s = 0, measured_s = 0;            // their totals
  double factor(const std::vector<double>& features) const;
};

struct CalibrationFitOptions {
  // Ridge penalty on the slopes, in units of the weighted feature variance (natural-log features).
  double slope_penalty = 0.05;
  // A class needs this many samples to get a correction of its own.
  int min_ops_per_class = 2;
  // Keep a residual per traced shape; its log is shrunk by n / (n + shape_shrinkage) for n samples.
  bool per_shape_residuals = true;
  double shape_shrinkage = 2.0;
};

class Calibration {
 public:
  Calibration() = default;
  // `gap_per_compute_op_s`: the measured idle time of the compute stream per compute op (>= 0).
  static Calibration fit(const std::vector<CalibrationSample>& samples, double gap_per_compute_op_s,
                         const CalibrationFitOptions& options = {});

  // The multiplicative correction of an op (1 for communication and for classes without samples).
  double factor(const layouts::Op& op) const;
  // The calibrated price: raw * factor, plus the step gap for a compute op.
  OpCost apply(const layouts::Op& op, const OpCost& raw) const;
  double gap_per_compute_op_s() const { return gap_per_compute_op_s_; }
  const std::vector<CorrectionClass>& classes() const { return classes_; }
  // Residuals per traced shape (training_shape_key), on top of the class correction.
  const std::map<std::string, double>& shape_residuals() const { return shape_residuals_; }
  bool empty() const { return classes_.empty() && gap_per_compute_op_s_ == 0; }

  // The parameters as JSON (what the calibrations table stores) and back; from_json throws
  // std::runtime_error on a malformed text.
  std::string to_json() const;
  static Calibration from_json(const std::string& text);
  // "gemm 1.12x, attention_bwd 1.23x, norm 0.91x; gap 2.1 us per compute op" (factors at the centres, the
  // five classes with the most measured time).
  std::string summary() const;

 private:
  const CorrectionClass* find(const std::string& name) const;
  double class_factor(const layouts::Op& op) const;
  void fit_shape_residuals(const std::vector<CalibrationSample>& samples,
                           const CalibrationFitOptions& options);
  std::vector<CorrectionClass> classes_;
  std::map<std::string, double> shape_residuals_;
  double gap_per_compute_op_s_ = 0;
};

// The class an op is corrected in ("" for communication), and its features (see above).
std::string correction_class_of(const layouts::Op& op);
std::vector<double> correction_features(const layouts::Op& op);
std::vector<std::string> correction_feature_names(const layouts::Op& op);
// The work of an op without its place in the schedule: "gemm_accumulate 4096x2048x8192 bf16",
// "attention_bwd 4x16x16x2048x2048x64 causal bf16", "norm 16777216 bf16".
std::string training_shape_key(const layouts::Op& op);

}  // namespace megatune::cost_models
