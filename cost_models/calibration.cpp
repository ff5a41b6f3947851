// Calibration: the per-class ridge fits of log(measured / predicted), their application and their JSON.
#include "cost_models/calibration.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace megatune::cost_models {
namespace {

using layouts::OpKind;

constexpr const char* kPooledMemoryBound = "memory_bound";

bool is_matrix_kind(OpKind kind) {
  return kind == OpKind::kGemm || kind == OpKind::kAttentionForward || kind == OpKind::kAttentionBackward;
}

double safe_log(double x) { return std::log(std::max(x, 1e-30)); }

// Weighted ridge least squares of y on the centred features; fills the class's coefficients.
void fit_class(CorrectionClass& c, const std::vector<const CalibrationSample*>& samples,
               const CalibrationFitOptions& options) {
  const std::size_t p = correction_features(samples.front()->op).size();
  const auto n = static_cast<Eigen::Index>(samples.size());
  Eigen::MatrixXd x(n, static_cast<Eigen::Index>(p));
  Eigen::VectorXd y(n), w(n);
  c.lows.assign(p, 1e300);
  c.highs.assign(p, -1e300);
  for (Eigen::Index i = 0; i < n; ++i) {
    const CalibrationSample& s = *samples[static_cast<std::size_t>(i)];
    const std::vector<double> f = correction_features(s.op);
    for (std::size_t j = 0; j < p; ++j) {
      x(i, static_cast<Eigen::Index>(j)) = f[j];
      c.lows[j] = std::min(c.lows[j], f[j]);
      c.highs[j] = std::max(c.highs[j], f[j]);
    }
    y(i) = safe_log(s.measured_s) - safe_log(s.predicted_s);
    w(i) = s.predicted_s;  // not the measured time: that would favour the samples measured slow
    c.predicted_s += s.predicted_s;
    c.measured_s += s.measured_s;
  }
  w /= w.sum();
  const Eigen::RowVectorXd centre = w.transpose() * x;
  x.rowwise() -= centre;
  const double y_mean = w.dot(y);
  const Eigen::MatrixXd xtwx = x.transpose() * w.asDiagonal() * x;
  Eigen::MatrixXd penalty = Eigen::MatrixXd::Zero(xtwx.rows(), xtwx.cols());
  for (Eigen::Index j = 0; j < xtwx.rows(); ++j)
    penalty(j, j) = options.slope_penalty * std::max(xtwx(j, j), 1.0);
  const Eigen::VectorXd beta =
      (xtwx + penalty).ldlt().solve(x.transpose() * w.asDiagonal() * (y.array() - y_mean).matrix());
  c.slopes.assign(beta.data(), beta.data() + beta.size());
  c.centres.assign(centre.data(), centre.data() + centre.size());
  c.ops = static_cast<int>(samples.size());
  // The intercept that makes the class's corrected total equal its measured total (a fit in log space
  // matches the geometric mean, which would under-price the sum of the ops).
  double shaped_s = 0;
  for (const CalibrationSample* s : samples)
    shaped_s += s->predicted_s * c.factor(correction_features(s->op));
  c.log_intercept = std::log(c.measured_s / shaped_s);
}

std::vector<double> doubles(const nlohmann::json& array, std::size_t count, const char* field) {
  std::vector<double> v = array.get<std::vector<double>>();
  if (v.size() != count)
    throw std::runtime_error(std::string("calibration: ") + field + " has a wrong length");
  return v;
}

}  // namespace

std::string correction_class_of(const layouts::Op& op) {
  if (op.is_communication()) return "";
  // Weight-gradient GEMMs accumulate into fp32 (beta 1): a kernel of their own, with its own efficiency.
  if (op.kind == OpKind::kGemm && op.accumulate) return "gemm_accumulate";
  return layouts::op_kind_name(op.kind);
}

std::vector<double> correction_features(const layouts::Op& op) {
  if (op.kind == OpKind::kGemm) {
    const double bytes = static_cast<double>(layouts::dtype_bytes(op.dtype)) *
                         (static_cast<double>(op.m) * op.k + static_cast<double>(op.k) * op.n +
                          static_cast<double>(op.m) * op.n);
    return {safe_log(op.gemm_flops()), safe_log(op.gemm_flops() / std::max(bytes, 1.0))};
  }
  if (op.kind == OpKind::kAttentionForward || op.kind == OpKind::kAttentionBackward)
    return {safe_log(op.attention_flops()), safe_log(static_cast<double>(op.attention.head_dim))};
  return {safe_log(static_cast<double>(op.bytes))};
}

std::vector<std::string> correction_feature_names(const layouts::Op& op) {
  if (op.kind == OpKind::kGemm) return {"log_flops", "log_flops_per_byte"};
  if (op.kind == OpKind::kAttentionForward || op.kind == OpKind::kAttentionBackward)
    return {"log_flops", "log_head_dim"};
  return {"log_bytes"};
}

std::string training_shape_key(const layouts::Op& op) {
  std::string key = correction_class_of(op) + " ";
  const layouts::AttentionShape& a = op.attention;
  if (op.kind == OpKind::kGemm) {
    key += std::to_string(op.m) + "x" + std::to_string(op.n) + "x" + std::to_string(op.k);
  } else if (op.kind == OpKind::kAttentionForward || op.kind == OpKind::kAttentionBackward) {
    for (std::int64_t v : {a.batch, a.heads, a.kv_heads, a.seq_q, a.seq_kv}) key += std::to_string(v) + "x";
    key += std::to_string(a.head_dim);
    if (a.value_head_dim() != a.head_dim) key += "/" + std::to_string(a.value_head_dim());
    key += a.causal ? " causal" : " full";
  } else {
    key += std::to_string(op.bytes);
  }
  return key + " " + dtype_name(op.dtype);
}

double CorrectionClass::factor(const std::vector<double>& features) const {
  double log_factor = log_intercept;
  for (std::size_t j = 0; j < slopes.size() && j < features.size(); ++j)
    log_factor += slopes[j] * (std::clamp(features[j], lows[j], highs[j]) - centres[j]);
  return std::exp(log_factor);
}

Calibration Calibration::fit(const std::vector<CalibrationSample>& samples, double gap_per_compute_op_s,
                             const CalibrationFitOptions& options) {
  std::map<std::string, std::vector<const CalibrationSample*>> by_class;
  for (const CalibrationSample& s : samples) {
    const std::string name = correction_class_of(s.op);
    if (name.empty() || !(s.predicted_s > 0) || !(s.measured_s > 0)) continue;
    by_class[name].push_back(&s);
    if (!is_matrix_kind(s.op.kind)) by_class[kPooledMemoryBound].push_back(&s);
  }
  Calibration calibration;
  calibration.gap_per_compute_op_s_ = std::max(0.0, gap_per_compute_op_s);
  for (const auto& [name, members] : by_class) {
    if (static_cast<int>(members.size()) < options.min_ops_per_class) continue;
    CorrectionClass c;
    c.name = name;
    fit_class(c, members, options);
    calibration.classes_.push_back(std::move(c));
  }
  if (options.per_shape_residuals) calibration.fit_shape_residuals(samples, options);
  return calibration;
}

void Calibration::fit_shape_residuals(const std::vector<CalibrationSample>& samples,
                                      const CalibrationFitOptions& options) {
  struct Totals {
    double measured_s = 0, corrected_s = 0;
    int n = 0;
  };
  std::map<std::string, Totals> by_shape;
  for (const CalibrationSample& s : samples) {
    if (correction_class_of(s.op).empty() || !(s.predicted_s > 0) || !(s.measured_s > 0)) continue;
    Totals& t = by_shape[training_shape_key(s.op)];
    t.measured_s += s.measured_s;
    t.corrected_s += s.predicted_s * class_factor(s.op);
    t.n += 1;
  }
  for (const auto& [key, t] : by_shape) {
    const double shrink = t.n / (t.n + options.shape_shrinkage);
    shape_residuals_[key] = std::exp(shrink * std::log(t.measured_s / t.corrected_s));
  }
}

const CorrectionClass* Calibration::find(const std::string& name) const {
  for (const CorrectionClass& c : classes_)
    if (c.name == name) return &c;
  return nullptr;
}

double Calibration::class_factor(const layouts::Op& op) const {
  const std::string name = correction_class_of(op);
  if (name.empty()) return 1.0;
  const CorrectionClass* c = find(name);
  if (c == nullptr && !is_matrix_kind(op.kind)) c = find(kPooledMemoryBound);
  return c == nullptr ? 1.0 : c->factor(correction_features(op));
}

double Calibration::factor(const layouts::Op& op) const {
  if (op.is_communication()) return 1.0;
  const double by_class = class_factor(op);
  if (shape_residuals_.empty()) return by_class;
  const auto residual = shape_residuals_.find(training_shape_key(op));
  return residual == shape_residuals_.end() ? by_class : by_class * residual->second;
}

OpCost Calibration::apply(const layouts::Op& op, const OpCost& raw) const {
  if (op.is_communication()) return raw;
  return {raw.time_s * factor(op) + gap_per_compute_op_s_, raw.provenance};
}

std::string Calibration::to_json() const {
  nlohmann::json classes = nlohmann::json::array();
  for (const CorrectionClass& c : classes_)
    classes.push_back({{"name", c.name},
                       {"log_intercept", c.log_intercept},
                       {"slopes", c.slopes},
                       {"centres", c.centres},
                       {"lows", c.lows},
                       {"highs", c.highs},
                       {"ops", c.ops},
                       {"predicted_s", c.predicted_s},
                       {"measured_s", c.measured_s}});
  return nlohmann::json{{"gap_per_compute_op_s", gap_per_compute_op_s_},
                        {"classes", classes},
                        {"shape_residuals", shape_residuals_}}
      .dump();
}

Calibration Calibration::from_json(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    Calibration calibration;
    calibration.gap_per_compute_op_s_ = j.at("gap_per_compute_op_s").get<double>();
    for (const nlohmann::json& e : j.at("classes")) {
      CorrectionClass c;
      c.name = e.at("name").get<std::string>();
      c.log_intercept = e.at("log_intercept").get<double>();
      c.slopes = e.at("slopes").get<std::vector<double>>();
      c.centres = doubles(e.at("centres"), c.slopes.size(), "centres");
      c.lows = doubles(e.at("lows"), c.slopes.size(), "lows");
      c.highs = doubles(e.at("highs"), c.slopes.size(), "highs");
      c.ops = e.value("ops", 0);
      c.predicted_s = e.value("predicted_s", 0.0);
      c.measured_s = e.value("measured_s", 0.0);
      calibration.classes_.push_back(std::move(c));
    }
    if (const auto residuals = j.find("shape_residuals"); residuals != j.end())
      calibration.shape_residuals_ = residuals->get<std::map<std::string, double>>();
    return calibration;
  } catch (const nlohmann::json::exception& error) {
    throw std::runtime_error(std::string("calibration parameters: ") + error.what());
  }
}

std::string Calibration::summary() const {
  std::vector<const CorrectionClass*> sorted;
  for (const CorrectionClass& c : classes_) sorted.push_back(&c);
  std::sort(sorted.begin(), sorted.end(),
            [](const CorrectionClass* a, const CorrectionClass* b) { return a->measured_s > b->measured_s; });
  std::string text;
  char item[96];
  constexpr std::size_t kListed = 5;
  for (std::size_t i = 0; i < sorted.size() && i < kListed; ++i) {
    std::snprintf(item, sizeof item, "%s%s %.2fx", text.empty() ? "" : ", ", sorted[i]->name.c_str(),
                  std::exp(sorted[i]->log_intercept));
    text += item;
  }
  if (sorted.size() > kListed) text += " and " + std::to_string(sorted.size() - kListed) + " more classes";
  if (!shape_residuals_.empty()) text += "; " + std::to_string(shape_residuals_.size()) + " shapes as traced";
  std::snprintf(item, sizeof item, "%sgap %.2f us per compute op", text.empty() ? "" : "; ",
                gap_per_compute_op_s_ * 1e6);
  return text + item;
}

}  // namespace megatune::cost_models
