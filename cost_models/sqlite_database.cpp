// Database, Statement and Transaction: checked wrappers over the sqlite3 C API.
#include "cost_models/sqlite_database.h"

#include <sqlite3.h>

#include <cstdio>
#include <string>
#include <utility>

namespace megatune::cost_models {

void check_sqlite(int result_code, sqlite3* connection, const char* call_text, const char* file, int line) {
  if (result_code == SQLITE_OK || result_code == SQLITE_ROW || result_code == SQLITE_DONE) return;
  std::string message = std::string(file) + ":" + std::to_string(line) + ": " + call_text + ": ";
  const char* detail = connection != nullptr ? sqlite3_errmsg(connection) : sqlite3_errstr(result_code);
  const std::string sqlite_message = detail != nullptr ? detail : sqlite3_errstr(result_code);
  message += sqlite_message + " (code " + std::to_string(result_code) + ")";
  throw SqliteError(message, result_code & 0xff, sqlite_message);
}

// ---- Statement ----

Statement::Statement(Database& database, std::string_view sql) : connection_(database.handle()) {
  MEGATUNE_SQLITE_CHECK(connection_, sqlite3_prepare_v2(connection_, sql.data(), static_cast<int>(sql.size()),
                                                        &statement_, nullptr));
}

Statement::~Statement() {
  if (statement_ != nullptr) sqlite3_finalize(statement_);
}

Statement::Statement(Statement&& other) noexcept
    : statement_(std::exchange(other.statement_, nullptr)), connection_(other.connection_) {}

Statement& Statement::operator=(Statement&& other) noexcept {
  if (this != &other) {
    if (statement_ != nullptr) sqlite3_finalize(statement_);
    statement_ = std::exchange(other.statement_, nullptr);
    connection_ = other.connection_;
  }
  return *this;
}

Statement& Statement::bind(int index, std::int64_t value) {
  MEGATUNE_SQLITE_CHECK(connection_, sqlite3_bind_int64(statement_, index, value));
  return *this;
}

Statement& Statement::bind(int index, double value) {
  MEGATUNE_SQLITE_CHECK(connection_, sqlite3_bind_double(statement_, index, value));
  return *this;
}

Statement& Statement::bind(int index, std::string_view value) {
  MEGATUNE_SQLITE_CHECK(connection_, sqlite3_bind_text64(statement_, index, value.data(), value.size(),
                                                         SQLITE_TRANSIENT, SQLITE_UTF8));
  return *this;
}

Statement& Statement::bind(int index, std::nullptr_t) {
  MEGATUNE_SQLITE_CHECK(connection_, sqlite3_bind_null(statement_, index));
  return *this;
}

int Statement::parameter_index(std::string_view name) const {
  const int index = sqlite3_bind_parameter_index(statement_, std::string(name).c_str());
  if (index == 0) {
    throw SqliteError("statement has no parameter named '" + std::string(name) +
                          "': " + (sqlite3_sql(statement_) != nullptr ? sqlite3_sql(statement_) : ""),
                      SQLITE_RANGE);
  }
  return index;
}

bool Statement::step() {
  const int result = sqlite3_step(statement_);
  MEGATUNE_SQLITE_CHECK(connection_, result);
  return result == SQLITE_ROW;
}

void Statement::run() {
  while (step()) {
  }
}

void Statement::reset() {
  // sqlite3_reset returns the error of the last step, which was already reported by step().
  sqlite3_reset(statement_);
  MEGATUNE_SQLITE_CHECK(connection_, sqlite3_clear_bindings(statement_));
}

int Statement::column_count() const { return sqlite3_column_count(statement_); }

std::string Statement::column_name(int column) const {
  const char* name = sqlite3_column_name(statement_, column);
  return name != nullptr ? name : "";
}

bool Statement::column_is_null(int column) const {
  return sqlite3_column_type(statement_, column) == SQLITE_NULL;
}

std::int64_t Statement::column_int64(int column) const { return sqlite3_column_int64(statement_, column); }

double Statement::column_double(int column) const { return sqlite3_column_double(statement_, column); }

std::string Statement::column_text(int column) const {
  const unsigned char* text = sqlite3_column_text(statement_, column);
  if (text == nullptr) return "";
  return std::string(reinterpret_cast<const char*>(text),
                     static_cast<std::size_t>(sqlite3_column_bytes(statement_, column)));
}

std::optional<double> Statement::column_optional_double(int column) const {
  if (column_is_null(column)) return std::nullopt;
  return column_double(column);
}

// ---- Database ----

Database::Database(const std::string& path, const DatabaseOpenOptions& options) : path_(path) {
  int flags = SQLITE_OPEN_NOMUTEX;
  if (options.read_only) {
    flags |= SQLITE_OPEN_READONLY;
  } else {
    flags |= SQLITE_OPEN_READWRITE;
    if (options.create_if_missing) flags |= SQLITE_OPEN_CREATE;
  }
  std::string name = path;
  if (options.read_only && options.immutable) {
    flags |= SQLITE_OPEN_URI;
    name = "file:";
    for (const char c : path) {
      if (c == '%' || c == '?' || c == '#') {
        char escaped[4];
        std::snprintf(escaped, sizeof escaped, "%%%02X", static_cast<unsigned char>(c));
        name += escaped;
      } else {
        name += c;
      }
    }
    name += "?immutable=1";
  }
  const int result = sqlite3_open_v2(name.c_str(), &connection_, flags, nullptr);
  if (result != SQLITE_OK) {
    const std::string detail = connection_ != nullptr ? sqlite3_errmsg(connection_) : sqlite3_errstr(result);
    const std::string message =
        std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": sqlite3_open_v2(" + path + "): " + detail;
    if (connection_ != nullptr) sqlite3_close_v2(connection_);
    connection_ = nullptr;
    throw SqliteError(message, result & 0xff, detail);
  }
  MEGATUNE_SQLITE_CHECK(connection_, sqlite3_extended_result_codes(connection_, 0));
  MEGATUNE_SQLITE_CHECK(connection_, sqlite3_busy_timeout(connection_, options.busy_timeout_ms));
}

Database::~Database() {
  if (connection_ != nullptr) sqlite3_close_v2(connection_);
}

Database::Database(Database&& other) noexcept
    : connection_(std::exchange(other.connection_, nullptr)), path_(std::move(other.path_)) {}

Database& Database::operator=(Database&& other) noexcept {
  if (this != &other) {
    if (connection_ != nullptr) sqlite3_close_v2(connection_);
    connection_ = std::exchange(other.connection_, nullptr);
    path_ = std::move(other.path_);
  }
  return *this;
}

void Database::execute(std::string_view sql) {
  char* error = nullptr;
  const int result = sqlite3_exec(connection_, std::string(sql).c_str(), nullptr, nullptr, &error);
  if (result != SQLITE_OK) {
    std::string detail = error != nullptr ? error : sqlite3_errstr(result);
    sqlite3_free(error);
    throw SqliteError(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": sqlite3_exec(" +
                          std::string(sql.substr(0, 80)) + "): " + detail + " (code " +
                          std::to_string(result) + ")",
                      result & 0xff, detail);
  }
}

std::int64_t Database::query_int64(std::string_view sql) {
  Statement statement(*this, sql);
  return statement.step() ? statement.column_int64(0) : 0;
}

std::int64_t Database::last_insert_rowid() const { return sqlite3_last_insert_rowid(connection_); }

bool Database::read_only() const { return sqlite3_db_readonly(connection_, "main") == 1; }

int Database::changes() const { return sqlite3_changes(connection_); }

// ---- Transaction ----

Transaction::Transaction(Database& database, Mode mode) : database_(&database) {
  database_->execute(mode == Mode::kImmediate ? "BEGIN IMMEDIATE" : "BEGIN DEFERRED");
  open_ = true;
}

Transaction::~Transaction() {
  if (open_) {
    // Best effort: a failed rollback leaves SQLite to roll back when the connection closes.
    sqlite3_exec(database_->handle(), "ROLLBACK", nullptr, nullptr, nullptr);
  }
}

void Transaction::commit() {
  if (!open_) throw SqliteError("Transaction::commit on a transaction that is not open", SQLITE_MISUSE);
  database_->execute("COMMIT");
  open_ = false;
}

void Transaction::rollback() {
  if (!open_) return;
  open_ = false;
  database_->execute("ROLLBACK");
}

}  // namespace megatune::cost_models
