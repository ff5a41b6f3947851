// EfficiencySurface and LinearTimeModel: weighted least-squares fits with Eigen, evaluation, JSON form.
#include "cost_models/fitted_forms.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "cost_models/json_value.h"

namespace megatune::cost_models {
namespace {

constexpr double kMinEfficiency = 1e-4;
constexpr double kMaxEfficiency = 0.9999;

double logit(double efficiency) {
  const double e = std::clamp(efficiency, kMinEfficiency, kMaxEfficiency);
  return std::log(e / (1.0 - e));
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// r2 on log time and mean absolute percentage error on time.
FitQuality quality_of(const std::vector<double>& measured_s, const std::vector<double>& predicted_s) {
  FitQuality quality;
  quality.n_points = static_cast<int>(measured_s.size());
  if (measured_s.empty()) return quality;
  double mean = 0;
  for (const double t : measured_s) mean += std::log(t);
  mean /= static_cast<double>(measured_s.size());
  double total = 0, residual = 0, ape = 0;
  for (std::size_t i = 0; i < measured_s.size(); ++i) {
    const double y = std::log(measured_s[i]);
    const double f = std::log(std::max(predicted_s[i], 1e-30));
    total += (y - mean) * (y - mean);
    residual += (y - f) * (y - f);
    ape += std::fabs(predicted_s[i] - measured_s[i]) / measured_s[i];
  }
  quality.r2 = total > 0 ? 1.0 - residual / total : (residual < 1e-18 ? 1.0 : 0.0);
  quality.mape = ape / static_cast<double>(measured_s.size());
  return quality;
}

std::vector<double> numbers_of(const JsonValue& array, std::size_t expected, const char* key) {
  if (!array.is_array() || array.as_array().size() != expected) {
    throw std::runtime_error(std::string("fitted model parameters: \"") + key + "\" must be an array of " +
                             std::to_string(expected) + " numbers");
  }
  std::vector<double> out;
  for (const JsonValue& value : array.as_array()) out.push_back(value.as_number());
  return out;
}

}  // namespace

int EfficiencySurface::term_count(int dimensions) {
  return 1 + dimensions + dimensions * (dimensions + 1) / 2;
}

namespace {
// phi(z) = [1, z_i, z_i z_j (i <= j)] for normalized coordinates z in [-1, 1].
void features(const std::array<double, 4>& z, int dimensions, double* out) {
  int t = 0;
  out[t++] = 1.0;
  for (int i = 0; i < dimensions; ++i) out[t++] = z[i];
  for (int i = 0; i < dimensions; ++i) {
    for (int j = i; j < dimensions; ++j) out[t++] = z[i] * z[j];
  }
}
}  // namespace

EfficiencySurface EfficiencySurface::fit(const std::vector<Sample>& samples, int dimensions,
                                         FitQuality* quality) {
  if (dimensions < 1 || dimensions > 4)
    throw std::invalid_argument("EfficiencySurface: dimensions must be 1..4");
  const int terms = term_count(dimensions);
  if (static_cast<int>(samples.size()) < terms) {
    throw std::invalid_argument("EfficiencySurface: " + std::to_string(samples.size()) + " samples for " +
                                std::to_string(terms) + " terms");
  }
  EfficiencySurface surface;
  surface.dimensions_ = dimensions;
  surface.log_lo_.fill(0);
  surface.log_hi_.fill(0);
  for (int d = 0; d < dimensions; ++d) {
    double lo = INFINITY, hi = -INFINITY;
    for (const Sample& sample : samples) {
      const double x = std::log(std::max(sample.shape[d], 1.0));
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    surface.log_lo_[d] = lo;
    surface.log_hi_[d] = hi;
  }
  const Eigen::Index rows = static_cast<Eigen::Index>(samples.size());
  const double ridge = 1e-6;
  Eigen::MatrixXd design(rows + terms, terms);
  Eigen::VectorXd target(rows + terms);
  design.setZero();
  target.setZero();
  std::vector<double> phi(static_cast<std::size_t>(terms));
  for (Eigen::Index r = 0; r < rows; ++r) {
    const Sample& sample = samples[static_cast<std::size_t>(r)];
    std::array<double, 4> z{};
    for (int d = 0; d < dimensions; ++d) {
      const double span = surface.log_hi_[d] - surface.log_lo_[d];
      const double x = std::log(std::max(sample.shape[d], 1.0));
      z[d] = span > 0 ? 2.0 * (x - surface.log_lo_[d]) / span - 1.0 : 0.0;
    }
    features(z, dimensions, phi.data());
    for (int t = 0; t < terms; ++t) design(r, t) = phi[static_cast<std::size_t>(t)];
    target(r) = logit(sample.efficiency);
  }
  for (int t = 0; t < terms; ++t) design(rows + t, t) = std::sqrt(ridge);
  const Eigen::VectorXd weights = design.colPivHouseholderQr().solve(target);
  surface.weights_.assign(weights.data(), weights.data() + weights.size());
  if (quality != nullptr) {
    std::vector<double> measured, predicted;
    for (const Sample& sample : samples) {
      measured.push_back(sample.ideal_time_s / std::clamp(sample.efficiency, kMinEfficiency, 1.0));
      predicted.push_back(sample.ideal_time_s / surface.efficiency(sample.shape));
    }
    *quality = quality_of(measured, predicted);
  }
  return surface;
}

double EfficiencySurface::efficiency(const std::array<double, 4>& shape) const {
  if (weights_.empty()) return 0;
  std::array<double, 4> z{};
  for (int d = 0; d < dimensions_; ++d) {
    const double span = log_hi_[d] - log_lo_[d];
    const double x = std::clamp(std::log(std::max(shape[d], 1.0)), log_lo_[d], log_hi_[d]);
    z[d] = span > 0 ? 2.0 * (x - log_lo_[d]) / span - 1.0 : 0.0;
  }
  double phi[15];
  features(z, dimensions_, phi);
  double sum = 0;
  for (std::size_t t = 0; t < weights_.size(); ++t) sum += weights_[t] * phi[t];
  return std::clamp(sigmoid(sum), kMinEfficiency, kMaxEfficiency);
}

std::string EfficiencySurface::to_json() const {
  JsonValue lo, hi, w;
  for (int d = 0; d < dimensions_; ++d) {
    lo.push_back(log_lo_[d]);
    hi.push_back(log_hi_[d]);
  }
  for (const double weight : weights_) w.push_back(weight);
  JsonValue document;
  document.set("form", "logit_quadratic_log");
  document.set("dims", dimensions_);
  document.set("lo", lo);
  document.set("hi", hi);
  document.set("w", w);
  return document.dump();
}

EfficiencySurface EfficiencySurface::from_json(const std::string& params_json) {
  const JsonValue document = JsonValue::parse(params_json);
  if (document.at("form").as_string() != "logit_quadratic_log") {
    throw std::runtime_error("fitted model parameters: form \"" + document.at("form").as_string() +
                             "\" is not an efficiency surface");
  }
  EfficiencySurface surface;
  const std::int64_t dimensions = document.at("dims").as_int64();
  if (dimensions < 1 || dimensions > 4)
    throw std::runtime_error("fitted model parameters: dims must be 1..4");
  surface.dimensions_ = static_cast<int>(dimensions);
  const auto lo = numbers_of(document.at("lo"), static_cast<std::size_t>(dimensions), "lo");
  const auto hi = numbers_of(document.at("hi"), static_cast<std::size_t>(dimensions), "hi");
  for (int d = 0; d < surface.dimensions_; ++d) {
    surface.log_lo_[d] = lo[static_cast<std::size_t>(d)];
    surface.log_hi_[d] = hi[static_cast<std::size_t>(d)];
  }
  surface.weights_ =
      numbers_of(document.at("w"), static_cast<std::size_t>(term_count(surface.dimensions_)), "w");
  return surface;
}

LinearTimeModel LinearTimeModel::fit(const std::vector<std::pair<double, double>>& bytes_and_time_s,
                                     FitQuality* quality) {
  std::vector<std::pair<double, double>> points;
  for (const auto& [bytes, time_s] : bytes_and_time_s) {
    if (time_s > 0 && bytes >= 0) points.emplace_back(bytes, time_s);
  }
  double smallest = INFINITY, largest = -INFINITY;
  for (const auto& point : points) {
    smallest = std::min(smallest, point.first);
    largest = std::max(largest, point.first);
  }
  if (points.size() < 2 || !(largest > smallest)) {
    throw std::invalid_argument("LinearTimeModel: need at least two distinct sizes with positive times");
  }
  // Rows weighted by 1/t: minimize sum ((a + b x - t) / t)^2.
  Eigen::MatrixXd design(static_cast<Eigen::Index>(points.size()), 2);
  Eigen::VectorXd target(static_cast<Eigen::Index>(points.size()));
  const double scale = largest;  // keep the columns of similar magnitude
  for (std::size_t i = 0; i < points.size(); ++i) {
    const auto r = static_cast<Eigen::Index>(i);
    design(r, 0) = 1.0 / points[i].second;
    design(r, 1) = points[i].first / scale / points[i].second;
    target(r) = 1.0;
  }
  Eigen::Vector2d solution = design.colPivHouseholderQr().solve(target);
  LinearTimeModel model{solution(0), solution(1) / scale};
  if (model.latency_s < 0) {
    double numerator = 0, denominator = 0;
    for (const auto& [x, t] : points) {
      numerator += x / t;
      denominator += (x / t) * (x / t);
    }
    model = {0.0, numerator / denominator};
  } else if (model.seconds_per_byte < 0) {
    double numerator = 0, denominator = 0;
    for (const auto& point : points) {
      numerator += 1.0 / point.second;
      denominator += 1.0 / (point.second * point.second);
    }
    model = {numerator / denominator, 0.0};
  }
  if (quality != nullptr) {
    std::vector<double> measured, predicted;
    for (const auto& [x, t] : points) {
      measured.push_back(t);
      predicted.push_back(model.time_s(x));
    }
    *quality = quality_of(measured, predicted);
  }
  return model;
}

std::string LinearTimeModel::to_json() const {
  JsonValue document;
  document.set("form", "latency_bandwidth");
  document.set("latency_s", latency_s);
  document.set("seconds_per_byte", seconds_per_byte);
  return document.dump();
}

LinearTimeModel LinearTimeModel::from_json(const std::string& params_json) {
  const JsonValue document = JsonValue::parse(params_json);
  if (document.at("form").as_string() != "latency_bandwidth") {
    throw std::runtime_error("fitted model parameters: form \"" + document.at("form").as_string() +
                             "\" is not a latency/bandwidth model");
  }
  LinearTimeModel model{document.at("latency_s").as_number(), document.at("seconds_per_byte").as_number()};
  if (model.latency_s < 0 || model.seconds_per_byte < 0) {
    throw std::runtime_error("fitted model parameters: latency and seconds_per_byte must not be negative");
  }
  return model;
}

}  // namespace megatune::cost_models
