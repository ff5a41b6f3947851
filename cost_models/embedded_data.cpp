// Loading the shipped hardware catalog and measurement tables into a database.
#include "cost_models/embedded_data.h"

#include <algorithm>

#include "cost_models/cost_database.h"
#include "cost_models/hardware_catalog.h"
#include "cost_models/table_io.h"

namespace megatune::cost_models {

// Defined in the source CMake generates from cost_models/data/*.csv.
const std::vector<EmbeddedTable>& generated_embedded_tables();

const std::vector<EmbeddedTable>& embedded_tables() {
  static const std::vector<EmbeddedTable> tables = [] {
    std::vector<EmbeddedTable> sorted = generated_embedded_tables();
    auto rank = [](const std::string& table) {
      const auto& all = cost_database_tables();
      for (std::size_t i = 0; i < all.size(); ++i) {
        if (all[i].name == table) return i;
      }
      return all.size();
    };
    std::stable_sort(sorted.begin(), sorted.end(), [&](const EmbeddedTable& a, const EmbeddedTable& b) {
      return rank(a.table) != rank(b.table) ? rank(a.table) < rank(b.table) : a.source_name < b.source_name;
    });
    return sorted;
  }();
  return tables;
}

std::int64_t install_embedded_data(Database& database) {
  std::int64_t rows = HardwareCatalog::embedded().install_into(database);
  for (const EmbeddedTable& table : embedded_tables()) {
    rows += import_table_text(database, table.table, TableFormat::kCsv, table.csv_text, table.source_name);
  }
  return rows;
}

Database open_embedded_cost_database() {
  Database database = open_in_memory_cost_database();
  install_embedded_data(database);
  return database;
}

}  // namespace megatune::cost_models
