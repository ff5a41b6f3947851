// MeasuredShapeTable and MeasuredSeries: exact lookups and interpolation in measured data.
#include "cost_models/measured_tables.h"

#include <algorithm>
#include <cmath>

namespace megatune::cost_models {

std::size_t ShapeKeyHash::operator()(const ShapeKey& key) const noexcept {
  std::size_t hash = 0xcbf29ce484222325ULL;
  for (const std::int64_t value : key) {
    hash ^= static_cast<std::size_t>(value) + 0x9e3779b97f4a7c15ULL + (hash << 6) + (hash >> 2);
  }
  return hash;
}

void MeasuredShapeTable::add(const ShapeKey& shape, double efficiency) {
  Point point;
  point.shape = shape;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    point.log_shape[i] = std::log(static_cast<double>(std::max<std::int64_t>(shape[i], 1)));
  }
  point.efficiency = efficiency;
  const auto by_first = [](const Point& a, double first) { return a.log_shape[0] < first; };
  if (index_.count(shape) > 0) {
    for (auto it = std::lower_bound(points_.begin(), points_.end(), point.log_shape[0], by_first);
         it != points_.end() && it->log_shape[0] == point.log_shape[0]; ++it) {
      if (it->shape == shape) it->efficiency = efficiency;
    }
  } else {
    points_.insert(std::upper_bound(points_.begin(), points_.end(), point.log_shape[0],
                                    [](double first, const Point& a) { return first < a.log_shape[0]; }),
                   point);
  }
  index_[shape] = efficiency;
}

std::optional<double> MeasuredShapeTable::exact(const ShapeKey& shape) const {
  const auto found = index_.find(shape);
  if (found == index_.end()) return std::nullopt;
  return found->second;
}

std::optional<double> MeasuredShapeTable::interpolate(const ShapeKey& shape, double max_ratio) const {
  std::array<double, 4> query{};
  for (std::size_t i = 0; i < shape.size(); ++i) {
    query[i] = std::log(static_cast<double>(std::max<std::int64_t>(shape[i], 1)));
  }
  const double radius = std::log(std::max(max_ratio, 1.0)) + 1e-12;
  double weight_sum = 0;
  double weighted_efficiency = 0;
  auto it = std::lower_bound(points_.begin(), points_.end(), query[0] - radius,
                             [](const Point& a, double first) { return a.log_shape[0] < first; });
  for (; it != points_.end() && it->log_shape[0] <= query[0] + radius; ++it) {
    const Point& point = *it;
    double distance_squared = 0;
    bool inside = true;
    for (std::size_t i = 0; i < query.size(); ++i) {
      const double delta = query[i] - point.log_shape[i];
      if (std::fabs(delta) > radius) {
        inside = false;
        break;
      }
      distance_squared += delta * delta;
    }
    if (!inside) continue;
    if (distance_squared < 1e-24) return point.efficiency;
    const double weight = 1.0 / distance_squared;
    weight_sum += weight;
    weighted_efficiency += weight * point.efficiency;
  }
  if (weight_sum == 0) return std::nullopt;
  return weighted_efficiency / weight_sum;
}

std::vector<std::pair<ShapeKey, double>> MeasuredShapeTable::entries() const {
  std::vector<std::pair<ShapeKey, double>> out;
  out.reserve(points_.size());
  for (const Point& point : points_) out.emplace_back(point.shape, point.efficiency);
  return out;
}

void MeasuredSeries::add(std::int64_t bytes, double time_s) {
  const auto position =
      std::lower_bound(points_.begin(), points_.end(), bytes,
                       [](const auto& point, std::int64_t size) { return point.first < size; });
  if (position != points_.end() && position->first == bytes) {
    position->second = time_s;
  } else {
    points_.insert(position, {bytes, time_s});
  }
}

std::optional<double> MeasuredSeries::exact(std::int64_t bytes) const {
  const auto position =
      std::lower_bound(points_.begin(), points_.end(), bytes,
                       [](const auto& point, std::int64_t size) { return point.first < size; });
  if (position != points_.end() && position->first == bytes) return position->second;
  return std::nullopt;
}

std::optional<double> MeasuredSeries::interpolate(double bytes) const {
  if (points_.size() < 2 || bytes < static_cast<double>(points_.front().first) ||
      bytes > static_cast<double>(points_.back().first) || bytes <= 0) {
    if (points_.size() == 1 && bytes == static_cast<double>(points_.front().first))
      return points_.front().second;
    return std::nullopt;
  }
  const auto upper = std::lower_bound(
      points_.begin(), points_.end(), bytes,
      [](const auto& point, double size) { return static_cast<double>(point.first) < size; });
  if (upper == points_.begin()) return upper->second;
  const auto lower = upper - 1;
  if (static_cast<double>(upper->first) == bytes) return upper->second;
  const double x0 = std::log(static_cast<double>(lower->first));
  const double x1 = std::log(static_cast<double>(upper->first));
  const double y0 = std::log(lower->second);
  const double y1 = std::log(upper->second);
  const double fraction = (std::log(bytes) - x0) / (x1 - x0);
  return std::exp(y0 + fraction * (y1 - y0));
}

}  // namespace megatune::cost_models
