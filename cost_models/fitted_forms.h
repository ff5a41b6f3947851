// The fitted model forms and their least-squares fits (Eigen): EfficiencySurface (logit efficiency as a
// quadratic in log shape dimensions) and LinearTimeModel (latency + bytes / bandwidth). Each serializes to
// the params_json stored in the fitted_models table.
#pragma once
#include <array>
#include <string>
#include <vector>

namespace megatune::cost_models {

struct FitQuality {
  double r2 = 0;    // on log time
  double mape = 0;  // on time, fraction
  int n_points = 0;
};

// efficiency(x) = sigmoid(w . phi(clamp(log x, lo, hi))), phi = [1, x_i, x_i*x_j (i <= j)]. Clamping to the
// measured range keeps extrapolation flat instead of letting a quadratic run away.
class EfficiencySurface {
 public:
  EfficiencySurface() = default;
  // One sample: shape dimensions (>= 1) and the efficiency measured there (0 < e <= 1).
  struct Sample {
    std::array<double, 4> shape;  // unused trailing dimensions 1
    double efficiency;
    double ideal_time_s =
        1;  // time at 100% efficiency (FLOPs / peak); the fit quality is on ideal / efficiency
  };
  // Fits `dimensions` (1..4) leading dims of the samples (at least as many samples as terms); throws
  // std::invalid_argument when there are too few. The quality is that of the time each sample implies
  // (time proportional to 1/efficiency).
  static EfficiencySurface fit(const std::vector<Sample>& samples, int dimensions, FitQuality* quality);
  double efficiency(const std::array<double, 4>& shape) const;
  int dimensions() const { return dimensions_; }
  bool empty() const { return weights_.empty(); }
  static int term_count(int dimensions);

  std::string to_json() const;  // {"form":"logit_quadratic_log","dims":D,"lo":[...],"hi":[...],"w":[...]}
  static EfficiencySurface from_json(const std::string& params_json);  // throws std::runtime_error

 private:
  int dimensions_ = 0;
  std::array<double, 4> log_lo_{}, log_hi_{};
  std::vector<double> weights_;
};

// time = latency_s + bytes * seconds_per_byte (seconds_per_byte = bus_factor / bus bandwidth for
// collectives, 1 / bandwidth for memory-bound kernels).
struct LinearTimeModel {
  double latency_s = 0;
  double seconds_per_byte = 0;
  double time_s(double bytes) const { return latency_s + bytes * seconds_per_byte; }
  // Least squares on relative error (rows weighted by 1/time) so small and large sizes both count; the
  // latency and slope are kept >= 0. Needs >= 2 distinct sizes (throws std::invalid_argument).
  static LinearTimeModel fit(const std::vector<std::pair<double, double>>& bytes_and_time_s,
                             FitQuality* quality);
  std::string to_json() const;  // {"form":"latency_bandwidth","latency_s":...,"seconds_per_byte":...}
  static LinearTimeModel from_json(const std::string& params_json);
};

}  // namespace megatune::cost_models
