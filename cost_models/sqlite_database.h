// Thin RAII layer over SQLite: Database (a connection), Statement (a prepared statement), Transaction.
// Every sqlite3 call is checked; failures throw SqliteError naming the file:line of the call and SQLite's
// message. Bad user files are reported by the schema layer (cost_database.h) as one-line UserErrors.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

struct sqlite3;
struct sqlite3_stmt;

namespace megatune::cost_models {

// A failed SQLite call: what(): "<file>:<line>: <call>: <sqlite message> (code N)".
class SqliteError : public std::runtime_error {
 public:
  SqliteError(const std::string& message, int sqlite_code, std::string sqlite_message = "")
      : std::runtime_error(message), sqlite_code_(sqlite_code), sqlite_message_(std::move(sqlite_message)) {}
  int sqlite_code() const { return sqlite_code_; }  // primary result code (SQLITE_BUSY, SQLITE_CORRUPT, ...)
  // SQLite's own message alone ("CHECK constraint failed: median_s > 0"), for messages about user input.
  const std::string& sqlite_message() const { return sqlite_message_; }

 private:
  int sqlite_code_;
  std::string sqlite_message_;
};

// Throws SqliteError when `result_code` is not SQLITE_OK/ROW/DONE. Use through MEGATUNE_SQLITE_CHECK.
void check_sqlite(int result_code, sqlite3* connection, const char* call_text, const char* file, int line);
#define MEGATUNE_SQLITE_CHECK(connection, call) \
  ::megatune::cost_models::check_sqlite((call), (connection), #call, __FILE__, __LINE__)

class Database;

// One prepared statement. Parameters are 1-based (SQLite's convention); columns are 0-based.
class Statement {
 public:
  Statement(Database& database, std::string_view sql);
  ~Statement();
  Statement(Statement&& other) noexcept;
  Statement& operator=(Statement&& other) noexcept;
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Statement& bind(int index, std::int64_t value);
  Statement& bind(int index, int value) { return bind(index, static_cast<std::int64_t>(value)); }
  Statement& bind(int index, double value);
  Statement& bind(int index, std::string_view value);
  Statement& bind(int index, const char* value) { return bind(index, std::string_view(value)); }
  Statement& bind(int index, const std::string& value) { return bind(index, std::string_view(value)); }
  Statement& bind(int index, std::nullptr_t);
  template <typename T>
  Statement& bind(int index, const std::optional<T>& value) {
    return value ? bind(index, *value) : bind(index, nullptr);
  }
  // Bind by name (":name", "@name" or "$name" as written in the SQL); throws if the SQL has no such name.
  template <typename T>
  Statement& bind(std::string_view name, const T& value) {
    return bind(parameter_index(name), value);
  }
  int parameter_index(std::string_view name) const;

  // Advances; true when a row is available, false when done. Throws on error.
  bool step();
  // Runs to completion (for statements that return no rows or whose rows are not needed).
  void run();
  // Resets for re-execution and clears bindings.
  void reset();

  int column_count() const;
  std::string column_name(int column) const;
  bool column_is_null(int column) const;
  std::int64_t column_int64(int column) const;
  double column_double(int column) const;
  std::string column_text(int column) const;
  std::optional<double> column_optional_double(int column) const;

  sqlite3_stmt* handle() const { return statement_; }

 private:
  sqlite3_stmt* statement_ = nullptr;
  sqlite3* connection_ = nullptr;
};

struct DatabaseOpenOptions {
  bool create_if_missing = true;
  bool read_only = false;
  // With read_only: the file cannot change while open (SQLite's immutable=1), so no -shm/-wal files are
  // needed: how a WAL database in a folder this process cannot write is read.
  bool immutable = false;
  int busy_timeout_ms = 30000;  // wait this long for another writer before SQLITE_BUSY
};

// One connection. Opening sets WAL (file databases), busy_timeout, foreign keys and synchronous=NORMAL.
// Not shared between threads: give each thread (or process) its own Database.
class Database {
 public:
  // `path` ":memory:" opens a private in-memory database.
  explicit Database(const std::string& path, const DatabaseOpenOptions& options = {});
  ~Database();
  Database(Database&& other) noexcept;
  Database& operator=(Database&& other) noexcept;
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  // Runs one or more statements that return no rows.
  void execute(std::string_view sql);
  // First column of the first row of `sql` as an integer (0 when there is no row).
  std::int64_t query_int64(std::string_view sql);
  Statement prepare(std::string_view sql) { return Statement(*this, sql); }
  std::int64_t last_insert_rowid() const;
  int changes() const;  // rows changed by the last statement
  const std::string& path() const { return path_; }
  bool in_memory() const { return path_ == ":memory:" || path_.empty(); }
  bool read_only() const;  // opened read-only (asked for, or the file is not writable)
  sqlite3* handle() const { return connection_; }

 private:
  sqlite3* connection_ = nullptr;
  std::string path_;
};

// RAII transaction: begins in the constructor (IMMEDIATE for writers so that two writers queue on the
// write lock instead of deadlocking on lock upgrade; DEFERRED for readers), rolls back in the destructor
// unless commit() was called.
class Transaction {
 public:
  enum class Mode { kDeferred, kImmediate };
  explicit Transaction(Database& database, Mode mode = Mode::kImmediate);
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  void commit();
  void rollback();

 private:
  Database* database_;
  bool open_ = false;
};

}  // namespace megatune::cost_models
