// Lookup and interpolation in measured data: MeasuredShapeTable (efficiency over up to four shape
// dimensions, interpolated in log space) and MeasuredSeries (time over bytes, interpolated log-log).
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace megatune::cost_models {

// Shape dimensions (unused trailing ones 1), e.g. GEMM (m, n, k, 1); attention (batch*heads, seq_q, seq_kv,
// head_dim).
using ShapeKey = std::array<std::int64_t, 4>;

struct ShapeKeyHash {
  std::size_t operator()(const ShapeKey& key) const noexcept;
};

// Measured efficiencies (achieved FLOP/s / peak) by shape.
class MeasuredShapeTable {
 public:
  // Adds or replaces the efficiency measured at `shape` (every dimension >= 1).
  void add(const ShapeKey& shape, double efficiency);
  std::optional<double> exact(const ShapeKey& shape) const;
  // Inverse-distance-weighted efficiency (distance in log space) of the measured shapes whose every
  // dimension is within `max_ratio` of the query's; nullopt when there is none.
  std::optional<double> interpolate(const ShapeKey& shape, double max_ratio) const;
  std::size_t size() const { return points_.size(); }
  bool empty() const { return points_.empty(); }
  // Every (shape, efficiency), ordered by the first dimension.
  std::vector<std::pair<ShapeKey, double>> entries() const;

 private:
  struct Point {
    ShapeKey shape;
    std::array<double, 4> log_shape;
    double efficiency;
  };
  std::vector<Point>
      points_;  // sorted by log_shape[0], so a query scans only its window of the first dimension
  std::unordered_map<ShapeKey, double, ShapeKeyHash> index_;  // shape -> efficiency
};

// Measured times by size in bytes (one kernel kind or one collective configuration).
class MeasuredSeries {
 public:
  void add(std::int64_t bytes, double time_s);  // replaces a point of the same size
  std::optional<double> exact(std::int64_t bytes) const;
  // Piecewise linear in (log bytes, log time) between the two measured sizes around `bytes`; nullopt
  // outside the measured range.
  std::optional<double> interpolate(double bytes) const;
  std::size_t size() const { return points_.size(); }
  const std::vector<std::pair<std::int64_t, double>>& points() const { return points_; }  // sorted by bytes

 private:
  std::vector<std::pair<std::int64_t, double>> points_;
};

}  // namespace megatune::cost_models
