// libFuzzer target: the cost models' readers of user files must answer any bytes with a UserError (or
// success), never a crash, hang or sanitizer report. The first input byte picks the reader: a cluster JSON
// file (--cluster), a CSV import or a JSON import (db import) into a fresh in-memory database.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "base/user_error.h"
#include "cost_models/cluster_spec.h"
#include "cost_models/cost_database.h"
#include "cost_models/table_io.h"
#include "layouts/fuzz/fuzz_files.h"

namespace {

namespace fs = std::filesystem;
using namespace megatune::cost_models;

const fs::path& work_directory() { return megatune::fuzz::work_directory("cost"); }

using megatune::fuzz::write_file;

void fuzz_cluster(const uint8_t* data, size_t size) {
  const fs::path path = work_directory() / "cluster.json";
  write_file(path, data, size);
  try {
    const ClusterSpec spec = parse_cluster_spec(path.string());
    (void)spec.describe();
  } catch (const megatune::UserError&) {
  }
}

void fuzz_import(const uint8_t* data, size_t size, const char* extension) {
  static Database database = open_in_memory_cost_database();
  const fs::path path = work_directory() / (std::string("table") + extension);
  write_file(path, data, size);
  for (const char* table : {"gpu_models", "kernel_timings", "collective_timings"}) {
    try {
      import_table_file(database, table, path.string());
    } catch (const megatune::UserError&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  switch (data[0] % 3) {
    case 0:
      fuzz_cluster(data + 1, size - 1);
      break;
    case 1:
      fuzz_import(data + 1, size - 1, ".csv");
      break;
    default:
      fuzz_import(data + 1, size - 1, ".json");
      break;
  }
  return 0;
}
