// CSV/JSON import (validated, all-or-nothing) and export of cost-database tables.
#include "cost_models/table_io.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>

#include "base/input_file.h"
#include "base/user_error.h"
#include "cost_models/cost_database.h"
#include "cost_models/json_value.h"
#include "cost_models/plausible_ranges.h"

namespace megatune::cost_models {
namespace {

using Type = ColumnDescription::Type;

// One input row: its line in the file and the value of each column it gives (nullopt = empty / null).
struct InputRow {
  int line = 0;
  std::vector<std::pair<std::string, std::optional<std::string>>> fields;
};

[[noreturn]] void bad(const std::string& source, int line, const std::string& problem) {
  throw UserError(source + ":" + std::to_string(line) + ": " + problem +
                  "; fix the row (nothing was imported)");
}

// RFC 4180 records with the line each starts on.
std::vector<std::pair<int, std::vector<std::string>>> parse_csv(const std::string& text,
                                                                const std::string& source) {
  std::vector<std::pair<int, std::vector<std::string>>> records;
  std::vector<std::string> fields;
  std::string field;
  int line = 1, record_line = 1;
  bool quoted = false, field_started = false, any = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"') {
        if (i + 1 < text.size() && text[i + 1] == '"') {
          field += '"';
          ++i;
        } else {
          quoted = false;
        }
      } else {
        if (c == '\n') ++line;
        field += c;
      }
      continue;
    }
    if (c == '"') {
      if (field_started && !field.empty()) bad(source, line, "a quote inside an unquoted field");
      quoted = true;
      field_started = true;
      any = true;
    } else if (c == ',') {
      fields.push_back(std::move(field));
      field.clear();
      field_started = false;
      any = true;
    } else if (c == '\r') {
      continue;
    } else if (c == '\n') {
      if (any || field_started || !field.empty()) {
        fields.push_back(std::move(field));
        records.emplace_back(record_line, std::move(fields));
      }
      fields.clear();
      field.clear();
      field_started = false;
      any = false;
      ++line;
      record_line = line;
    } else {
      field += c;
      field_started = true;
      any = true;
    }
  }
  if (quoted) bad(source, record_line, "unterminated quoted field");
  if (any || field_started || !field.empty()) {
    fields.push_back(std::move(field));
    records.emplace_back(record_line, std::move(fields));
  }
  return records;
}

// A column name the table does not have is a UserError listing the ones it has.
void require_column(const TableDescription& table, const std::string& name, const std::string& source,
                    int line) {
  std::string known;
  for (const ColumnDescription& column : table.columns) {
    if (column.name == name) return;
    known += (known.empty() ? "" : ", ") + column.name;
  }
  bad(source, line, "column \"" + name + "\" is not in table " + table.name + " (columns: " + known + ")");
}

std::vector<InputRow> rows_from_csv(const std::string& text, const std::string& source,
                                    const TableDescription& table) {
  const auto records = parse_csv(text, source);
  if (records.empty()) throw UserError(source + ": empty CSV; the first line must name the columns");
  const std::vector<std::string>& header = records.front().second;
  for (const std::string& name : header) require_column(table, name, source, records.front().first);
  std::vector<InputRow> rows;
  for (std::size_t r = 1; r < records.size(); ++r) {
    const auto& [line, values] = records[r];
    if (values.size() != header.size()) {
      bad(source, line,
          "has " + std::to_string(values.size()) + " fields but the header has " +
              std::to_string(header.size()));
    }
    InputRow row;
    row.line = line;
    for (std::size_t c = 0; c < header.size(); ++c) {
      row.fields.emplace_back(header[c],
                              values[c].empty() ? std::nullopt : std::optional<std::string>(values[c]));
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

// Line of the n-th '{' that opens an array element, for error messages on JSON rows.
int line_of_offset(const std::string& text, std::size_t offset) {
  int line = 1;
  for (std::size_t i = 0; i < offset && i < text.size(); ++i) line += text[i] == '\n' ? 1 : 0;
  return line;
}

std::string json_scalar_text(const JsonValue& value) {
  if (value.is_string()) return value.as_string();
  if (value.is_bool()) return value.as_bool() ? "1" : "0";
  return value.dump();
}

std::vector<InputRow> rows_from_json(const std::string& text, const std::string& source) {
  JsonValue document;
  try {
    document = JsonValue::parse(text);
  } catch (const JsonParseError& error) {
    bad(source, error.line(),
        "invalid JSON at column " + std::to_string(error.column()) + " (" + error.problem() + ")");
  }
  const JsonValue* array = &document;
  if (document.is_object()) {
    array = document.find("rows");
    if (array == nullptr)
      throw UserError(source + ": expected a JSON array of rows or an object with \"rows\"");
  }
  if (!array->is_array()) throw UserError(source + ": expected a JSON array of row objects");
  // Approximate each row's line by the position of its opening brace at nesting depth 1 (or 2 under "rows").
  std::vector<int> lines;
  {
    int depth = 0;
    bool in_string = false;
    const int row_depth = document.is_object() ? 2 : 1;
    for (std::size_t i = 0; i < text.size(); ++i) {
      const char c = text[i];
      if (in_string) {
        if (c == '\\') {
          ++i;
        } else if (c == '"') {
          in_string = false;
        }
        continue;
      }
      if (c == '"') {
        in_string = true;
      } else if (c == '{' || c == '[') {
        if (c == '{' && depth == row_depth) lines.push_back(line_of_offset(text, i));
        ++depth;
      } else if (c == '}' || c == ']') {
        --depth;
      }
    }
  }
  std::vector<InputRow> rows;
  const auto& items = array->as_array();
  for (std::size_t r = 0; r < items.size(); ++r) {
    InputRow row;
    row.line = r < lines.size() ? lines[r] : 0;
    if (!items[r].is_object())
      bad(source, row.line, "row " + std::to_string(r + 1) + " is not a JSON object");
    for (const auto& [name, value] : items[r].as_object()) {
      if (value.is_array() || value.is_object()) {
        // A nested value (e.g. config_json given as an object) is stored as its JSON text.
        row.fields.emplace_back(name, value.dump());
      } else {
        row.fields.emplace_back(
            name, value.is_null() ? std::nullopt : std::optional<std::string>(json_scalar_text(value)));
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::optional<std::int64_t> parse_integer(const std::string& text) {
  if (text.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (errno == 0 && end == text.c_str() + text.size()) return value;
  // Accept integral reals written with a decimal point or exponent ("1e6", "8.0").
  const double real = std::strtod(text.c_str(), &end);
  if (end == text.c_str() + text.size() && std::isfinite(real) && real == std::floor(real) &&
      std::fabs(real) < 9e18) {
    return static_cast<std::int64_t>(real);
  }
  return std::nullopt;
}

std::optional<double> parse_real(const std::string& text) {
  if (text.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (errno != 0 || end != text.c_str() + text.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

}  // namespace

TableFormat table_format_from_name(const std::string& name) {
  if (name == "csv") return TableFormat::kCsv;
  if (name == "json") return TableFormat::kJson;
  throw UserError("unknown format \"" + name + "\"; use csv or json");
}

TableFormat table_format_from_path(const std::string& path) {
  const auto dot = path.find_last_of('.');
  std::string extension = dot == std::string::npos ? "" : path.substr(dot + 1);
  for (char& c : extension) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (extension == "csv") return TableFormat::kCsv;
  if (extension == "json") return TableFormat::kJson;
  throw UserError("cannot tell the format of " + path + " from its extension; name it .csv or .json");
}

std::int64_t import_table_text(Database& database, const std::string& table_name, TableFormat format,
                               const std::string& text, const std::string& source_name) {
  const TableDescription& table = cost_database_table(table_name);
  if (const std::size_t nul = text.find('\0'); nul != std::string::npos)
    throw UserError(
        source_name + " holds binary data (a NUL byte at offset " + std::to_string(nul) +
        "), not CSV or JSON text; give the table as a .csv or .json text file (nothing was imported)");
  const std::vector<InputRow> rows = format == TableFormat::kCsv ? rows_from_csv(text, source_name, table)
                                                                 : rows_from_json(text, source_name);

  std::map<std::string, const ColumnDescription*> columns;
  for (const ColumnDescription& column : table.columns) columns[column.name] = &column;

  // Validate everything before writing anything.
  struct Typed {
    const ColumnDescription* column;
    std::optional<std::string> text;
    std::int64_t integer = 0;
    double real = 0;
  };
  std::vector<std::vector<Typed>> typed_rows;
  for (const InputRow& row : rows) {
    std::vector<Typed> typed;
    std::map<std::string, bool> seen;
    for (const auto& [name, value] : row.fields) {
      require_column(table, name, source_name, row.line);
      const auto found = columns.find(name);
      if (seen[name]) bad(source_name, row.line, "column \"" + name + "\" appears twice");
      seen[name] = true;
      Typed field{found->second, value};
      if (value) {
        if (found->second->type == Type::kInteger) {
          const auto parsed = parse_integer(*value);
          if (!parsed)
            bad(source_name, row.line, "column " + name + ": \"" + *value + "\" is not an integer");
          field.integer = *parsed;
        } else if (found->second->type == Type::kReal) {
          const auto parsed = parse_real(*value);
          if (!parsed) bad(source_name, row.line, "column " + name + ": \"" + *value + "\" is not a number");
          field.real = *parsed;
        }
        // Hardware figures of the catalog tables must be plausible (0: not supported / no NVLink domain).
        if (table.name == "gpu_models" || table.name == "interconnects") {
          const double number =
              found->second->type == Type::kInteger ? static_cast<double>(field.integer) : field.real;
          const auto range = plausible_range(name);
          const bool zero_ok = number == 0 && name != "memory_bytes";
          if (range && !zero_ok && !(number >= range->low && number <= range->high)) {
            bad(source_name, row.line,
                "column " + name + ": " + *value + " is outside the plausible " + range->unit +
                    "; check the value and its unit");
          }
        }
      }
      if (value || !found->second->required) typed.push_back(std::move(field));
    }
    for (const ColumnDescription& column : table.columns) {
      if (!column.required) continue;
      bool present = false;
      for (const Typed& field : typed)
        present = present || (field.column == &column && field.text.has_value());
      if (!present) bad(source_name, row.line, "column " + column.name + ": a value is required");
    }
    typed_rows.push_back(std::move(typed));
  }

  Transaction transaction(database);
  std::map<std::string, Statement> statements;  // by column list
  for (std::size_t r = 0; r < typed_rows.size(); ++r) {
    std::vector<Typed> given;
    for (Typed& field : typed_rows[r]) {
      if (field.text) given.push_back(field);  // empty optional fields take the column default
    }
    std::string names, placeholders, updates;
    for (const Typed& field : given) {
      names += (names.empty() ? "" : ", ") + field.column->name;
      placeholders += placeholders.empty() ? "?" : ", ?";
      bool in_key = false;
      for (const std::string& key : table.natural_key) in_key = in_key || key == field.column->name;
      if (!in_key)
        updates += (updates.empty() ? "" : ", ") + field.column->name + "=excluded." + field.column->name;
    }
    std::string sql = "INSERT INTO " + table.name + " (" + names + ") VALUES (" + placeholders + ")";
    if (!table.natural_key.empty()) {
      std::string key;
      for (const std::string& column : table.natural_key) key += (key.empty() ? "" : ", ") + column;
      sql += " ON CONFLICT (" + key + ") DO " +
             (updates.empty() ? std::string("NOTHING") : "UPDATE SET " + updates);
    }
    auto found = statements.find(sql);
    if (found == statements.end()) found = statements.emplace(sql, Statement(database, sql)).first;
    Statement& statement = found->second;
    statement.reset();
    int index = 1;
    for (const Typed& field : given) {
      switch (field.column->type) {
        case Type::kInteger:
          statement.bind(index++, field.integer);
          break;
        case Type::kReal:
          statement.bind(index++, field.real);
          break;
        case Type::kText:
          statement.bind(index++, *field.text);
          break;
      }
    }
    try {
      statement.run();
    } catch (const SqliteError& error) {
      const std::string detail = error.sqlite_message().empty() ? error.what() : error.sqlite_message();
      bad(source_name, rows[r].line, "rejected by table " + table.name + ": " + detail);
    }
  }
  transaction.commit();
  return static_cast<std::int64_t>(typed_rows.size());
}

std::int64_t import_table_file(Database& database, const std::string& table, const std::string& path) {
  const TableFormat format = table_format_from_path(path);
  const std::string text = read_regular_file(path, "db import file");
  return import_table_text(database, table, format, text, path);
}

std::int64_t export_table(Database& database, const std::string& table_name, TableFormat format,
                          std::ostream& out) {
  const TableDescription& table = cost_database_table(table_name);
  std::string names;
  for (const ColumnDescription& column : table.columns) names += (names.empty() ? "" : ", ") + column.name;
  Statement statement(database, "SELECT " + names + " FROM " + table.name + " ORDER BY " + table.order_by);
  std::int64_t count = 0;
  if (format == TableFormat::kCsv) {
    std::string header;
    for (const ColumnDescription& column : table.columns) header += (header.empty() ? "" : ",") + column.name;
    out << header << '\n';
  } else {
    out << "[";
  }
  while (statement.step()) {
    if (format == TableFormat::kCsv) {
      std::string line;
      for (std::size_t c = 0; c < table.columns.size(); ++c) {
        if (c > 0) line += ',';
        const int column = static_cast<int>(c);
        if (statement.column_is_null(column)) continue;
        switch (table.columns[c].type) {
          case Type::kInteger:
            line += std::to_string(statement.column_int64(column));
            break;
          case Type::kReal:
            line += JsonValue(statement.column_double(column)).dump();
            break;
          case Type::kText:
            line += csv_field(statement.column_text(column));
            break;
        }
      }
      out << line << '\n';
    } else {
      JsonValue row;
      for (std::size_t c = 0; c < table.columns.size(); ++c) {
        const int column = static_cast<int>(c);
        if (statement.column_is_null(column)) {
          row.set(table.columns[c].name, nullptr);
          continue;
        }
        switch (table.columns[c].type) {
          case Type::kInteger:
            row.set(table.columns[c].name, statement.column_int64(column));
            break;
          case Type::kReal:
            row.set(table.columns[c].name, statement.column_double(column));
            break;
          case Type::kText:
            row.set(table.columns[c].name, statement.column_text(column));
            break;
        }
      }
      out << (count == 0 ? "\n  " : ",\n  ") << row.dump();
    }
    ++count;
  }
  if (format == TableFormat::kJson) out << (count == 0 ? "]\n" : "\n]\n");
  return count;
}

}  // namespace megatune::cost_models
