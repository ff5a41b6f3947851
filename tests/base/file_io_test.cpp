// Input paths that never block (FIFOs, directories, devices refused on the open descriptor), outputs that
// replace a file only when complete, and worker pools that survive huge thread counts.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "base/input_file.h"
#include "base/output_file.h"
#include "base/user_error.h"
#include "base/worker_threads.h"

namespace megatune {
namespace {

namespace fs = std::filesystem;

class FileIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "megatune-fileio-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  std::string read(const std::string& name) const {
    std::ifstream in(path(name));
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path(name)) << text; }
  std::string message_of(const std::function<void()>& body) const {
    try {
      body();
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  }
  std::string dir_;
};

TEST_F(FileIoTest, FifoIsRefusedWithoutBlocking) {
  ASSERT_EQ(::mkfifo(path("pipe").c_str(), 0644), 0);
  const auto start = std::chrono::steady_clock::now();
  const std::string message = message_of([&] { read_regular_file(path("pipe"), "--cluster file"); });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
  EXPECT_NE(message.find("--cluster file"), std::string::npos) << message;
  EXPECT_NE(message.find("FIFO"), std::string::npos) << message;
  EXPECT_NE(message_of([&] { require_regular_file(path("pipe"), "x"); }).find("FIFO"), std::string::npos);
}

TEST_F(FileIoTest, DirectoryDeviceAndMissingPathsAreNamed) {
  EXPECT_NE(message_of([&] { read_regular_file(dir_, "input"); }).find("is a directory"), std::string::npos);
  EXPECT_NE(message_of([&] { read_regular_file("/dev/zero", "input"); }).find("is a device"),
            std::string::npos);
  EXPECT_NE(message_of([&] { read_regular_file(path("missing"), "input"); }).find("does not exist"),
            std::string::npos);
  EXPECT_EQ(non_regular_file_reason(path("missing")), "does not exist");
}

TEST_F(FileIoTest, RegularFileIsRead) {
  write("a.txt", "hello");
  EXPECT_EQ(read_regular_file(path("a.txt"), "input"), "hello");
  EXPECT_NE(message_of([&] { read_regular_file(path("a.txt"), "input", 2); }).find("larger"),
            std::string::npos);
}

TEST_F(FileIoTest, OutputReplacesOnlyOnCommit) {
  write("plan.json", "OLD");
  {
    OutputFile file(path("plan.json"), "--output");
    file.stream() << "NEW";
    EXPECT_EQ(read("plan.json"), "OLD");  // nothing replaced before commit
  }
  EXPECT_EQ(read("plan.json"), "OLD");  // abandoned: the old file stays, the temporary is gone
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
  write_output_file(path("plan.json"), "NEW", "--output");
  EXPECT_EQ(read("plan.json"), "NEW");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(FileIoTest, OutputKeepsPermissionsAndCreatesParents) {
  write("p.txt", "x");
  ::chmod(path("p.txt").c_str(), 0600);
  write_output_file(path("p.txt"), "y", "--output");
  struct stat status {};
  ASSERT_EQ(::stat(path("p.txt").c_str(), &status), 0);
  EXPECT_EQ(status.st_mode & 0777, 0600u);
  write_output_file(path("a/b/c.txt"), "z", "--trace");
  EXPECT_EQ(read("a/b/c.txt"), "z");
}

TEST_F(FileIoTest, FullDeviceFailsWithOneLine) {
  const std::string message = message_of([&] {
    OutputFile file("/dev/full", "--ops-out");
    file.stream() << std::string(1 << 20, 'x');
    file.commit();
  });
  EXPECT_NE(message.find("--ops-out /dev/full"), std::string::npos) << message;
  EXPECT_NE(message.find("No space left"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos);
  write_output_file("/dev/null", "fine", "--output");  // a device that accepts writes is written in place
}

TEST_F(FileIoTest, DirectoryAndUnreadFifoAsOutputAreRefused) {
  EXPECT_NE(message_of([&] { OutputFile file(dir_, "--output"); }).find("is a directory"), std::string::npos);
  ASSERT_EQ(::mkfifo(path("out.pipe").c_str(), 0644), 0);
  EXPECT_NE(message_of([&] { OutputFile file(path("out.pipe"), "--output"); }).find("no process reads"),
            std::string::npos);
}

TEST_F(FileIoTest, SymlinkTargetIsReplacedNotTheLink) {
  write("real.json", "OLD");
  fs::create_symlink(path("real.json"), path("link.json"));
  write_output_file(path("link.json"), "NEW", "--output");
  EXPECT_TRUE(fs::is_symlink(path("link.json")));
  EXPECT_EQ(read("real.json"), "NEW");
}

TEST(WorkerThreads, CountsAreResolvedAndCapped) {
  bool capped = false;
  EXPECT_EQ(resolve_thread_count(100000, "--threads", &capped), max_worker_threads());
  EXPECT_TRUE(capped);
  EXPECT_GE(resolve_thread_count(0, "--threads"), 1);
  EXPECT_EQ(resolve_thread_count(3, "--threads", &capped), 3);
  EXPECT_FALSE(capped);
  EXPECT_THROW(resolve_thread_count(-5, "--threads"), UserError);
  EXPECT_LE(max_worker_threads(), 1024);
}

TEST(WorkerThreads, PoolRunsWorkAndJoins) {
  std::atomic<int> runs{0};
  {
    WorkerThreads pool(7, [&] { runs.fetch_add(1); });
    EXPECT_LE(pool.started(), 7);
  }
  EXPECT_EQ(runs.load(), 7);
  // Unwinding through a pool joins instead of calling std::terminate.
  EXPECT_THROW(
      {
        WorkerThreads pool(2, [] {});
        throw std::runtime_error("unwind");
      },
      std::runtime_error);
}

}  // namespace
}  // namespace megatune
