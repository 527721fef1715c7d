// The memory the engine sizes itself by, on /proc and cgroup trees written here (the layouts of
// cgroup v2, v1, a hybrid of both, containers with and without their own cgroup namespace), and
// the process's own resident bytes measured on this machine.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "duet/core/sysinfo.h"

namespace duet {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

class SysinfoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("duet-sysinfo-test-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    files_.proc = (root_ / "proc").string();
    files_.cgroup = (root_ / "cgroup").string();
    fs::create_directories(root_ / "proc" / "self");
    fs::create_directories(root_ / "cgroup");
    meminfo(16 * kGiB, 10 * kGiB);
  }
  void TearDown() override { fs::remove_all(root_); }

  void write(const fs::path& path, const std::string& text) {
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  void meminfo(int64_t total, int64_t available) {
    write(root_ / "proc" / "meminfo", "MemTotal:       " + std::to_string(total / 1024) + " kB\nMemFree:         1 kB\n" +
                                          "MemAvailable:   " + std::to_string(available / 1024) + " kB\n");
  }
  void self_cgroup(const std::string& text) { write(root_ / "proc" / "self" / "cgroup", text); }
  // A v2 level: memory.max ("max" or bytes), memory.current, memory.stat's file counts.
  void v2(const std::string& dir, const std::string& max, int64_t current, int64_t active_file, int64_t inactive_file) {
    const fs::path d = root_ / "cgroup" / dir;
    write(d / "memory.max", max + "\n");
    write(d / "memory.current", std::to_string(current) + "\n");
    write(d / "memory.stat", "anon 1000\nfile " + std::to_string(active_file + inactive_file) + "\nactive_file " +
                                 std::to_string(active_file) + "\ninactive_file " + std::to_string(inactive_file) +
                                 "\nshmem 4096\n");
  }
  void v1(const std::string& dir, int64_t limit, int64_t usage, int64_t active_file, int64_t inactive_file,
          int64_t hierarchical = 9223372036854771712) {
    const fs::path d = root_ / "cgroup" / "memory" / dir;
    write(d / "memory.limit_in_bytes", std::to_string(limit) + "\n");
    write(d / "memory.usage_in_bytes", std::to_string(usage) + "\n");
    write(d / "memory.stat", "cache 5\nrss 7\nhierarchical_memory_limit " + std::to_string(hierarchical) +
                                 "\ntotal_cache 99\ntotal_active_file " + std::to_string(active_file) +
                                 "\ntotal_inactive_file " + std::to_string(inactive_file) + "\n");
  }

  fs::path root_;
  SystemFiles files_;
};

TEST_F(SysinfoTest, V2TheLevelWithTheLeastRoomLimits) {
  write(root_ / "cgroup" / "cgroup.controllers", "cpu memory pids\n");
  self_cgroup("0::/kube/pod1/ctr\n");
  v2("kube", std::to_string(8 * kGiB), 6 * kGiB, kGiB, 0);               // room: 3 GiB
  v2("kube/pod1", std::to_string(4 * kGiB), 3 * kGiB, 256 * kMiB, 256 * kMiB);  // room: 1.5 GiB
  v2("kube/pod1/ctr", "max", 3 * kGiB, 0, 0);                            // no limit
  const std::optional<CgroupMemory> cg = cgroup_memory(files_);
  ASSERT_TRUE(cg.has_value());
  EXPECT_EQ(cg->version, 2);
  EXPECT_EQ(fs::path(cg->path), root_ / "cgroup" / "kube" / "pod1");
  EXPECT_EQ(cg->limit_bytes, 4 * kGiB);
  EXPECT_EQ(cg->usage_bytes, 3 * kGiB);
  EXPECT_EQ(cg->file_bytes, 512 * kMiB);  // shmem is not dropped: not counted
  EXPECT_EQ(cg->headroom_bytes(), 1536 * kMiB);
  EXPECT_EQ(available_memory_bytes(files_), 1536 * kMiB);  // below the host's 10 GiB
  EXPECT_EQ(total_memory_bytes(files_), 4 * kGiB);

  // A host with less available than the cgroup allows: the host's figure.
  meminfo(16 * kGiB, kGiB);
  EXPECT_EQ(available_memory_bytes(files_), kGiB);
}

TEST_F(SysinfoTest, V2MemoryHighCountsAsALimit) {
  write(root_ / "cgroup" / "cgroup.controllers", "memory\n");
  self_cgroup("0::/svc\n");
  v2("svc", "max", kGiB, 0, 0);
  write(root_ / "cgroup" / "svc" / "memory.high", std::to_string(3 * kGiB) + "\n");
  EXPECT_EQ(available_memory_bytes(files_), 2 * kGiB);
}

TEST_F(SysinfoTest, V2ContainerSeesItsCgroupAsTheRoot) {
  // With a cgroup namespace the path is "/"; without one it names a folder the mount lacks.
  for (const char* listed : {"0::/\n", "0::/system.slice/docker-1234.scope\n"}) {
    SCOPED_TRACE(listed);
    write(root_ / "cgroup" / "cgroup.controllers", "memory\n");
    self_cgroup(listed);
    v2("", std::to_string(2 * kGiB), 512 * kMiB, 0, 0);
    EXPECT_EQ(available_memory_bytes(files_), 1536 * kMiB);
    EXPECT_EQ(total_memory_bytes(files_), 2 * kGiB);
  }
}

TEST_F(SysinfoTest, V1ReadsTheMemoryControllersHierarchy) {
  self_cgroup("9:name=systemd:/\n5:cpu,cpuacct:/\n4:memory:/docker/abc\n3:pids:/\n");
  v1("", 9223372036854771712, 12 * kGiB, 0, 0);                // the root: no limit
  v1("docker", 9223372036854771712, 6 * kGiB, 0, 0);
  v1("docker/abc", 2 * kGiB, kGiB, 256 * kMiB, 256 * kMiB);  // room: 1.5 GiB
  const std::optional<CgroupMemory> cg = cgroup_memory(files_);
  ASSERT_TRUE(cg.has_value());
  EXPECT_EQ(cg->version, 1);
  EXPECT_EQ(cg->limit_bytes, 2 * kGiB);
  EXPECT_EQ(cg->file_bytes, 512 * kMiB);
  EXPECT_EQ(available_memory_bytes(files_), 1536 * kMiB);
}

TEST_F(SysinfoTest, V1HierarchicalLimitOfAnAncestorCounts) {
  // The container sees only its own folder (the mount's root); an ancestor's lower limit shows in
  // memory.stat's hierarchical_memory_limit.
  self_cgroup("4:memory:/docker/abc\n");
  v1("", 9223372036854771712, kGiB, 0, 0, kGiB + 512 * kMiB);
  const std::optional<CgroupMemory> cg = cgroup_memory(files_);
  ASSERT_TRUE(cg.has_value());
  EXPECT_EQ(cg->limit_bytes, kGiB + 512 * kMiB);
  EXPECT_EQ(available_memory_bytes(files_), 512 * kMiB);
}

TEST_F(SysinfoTest, HybridSystemsKeepMemoryInV1) {
  write(root_ / "cgroup" / "unified" / "cgroup.controllers", "\n");
  self_cgroup("0::/user.slice\n4:memory:/user.slice\n");
  v1("user.slice", 3 * kGiB, kGiB, 0, 0);
  const std::optional<CgroupMemory> cg = cgroup_memory(files_);
  ASSERT_TRUE(cg.has_value());
  EXPECT_EQ(cg->version, 1);
  EXPECT_EQ(available_memory_bytes(files_), 2 * kGiB);
}

TEST_F(SysinfoTest, NoLimitLeavesTheHostsFigures) {
  self_cgroup("4:memory:/a\n");
  v1("a", 9223372036854771712, kGiB, 0, 0);
  EXPECT_FALSE(cgroup_memory(files_).has_value());
  EXPECT_EQ(available_memory_bytes(files_), 10 * kGiB);
  EXPECT_EQ(total_memory_bytes(files_), 16 * kGiB);

  // No memory cgroup mounted at all, or no /proc/self/cgroup.
  fs::remove_all(root_ / "cgroup" / "memory");
  EXPECT_FALSE(cgroup_memory(files_).has_value());
  fs::remove(root_ / "proc" / "self" / "cgroup");
  EXPECT_FALSE(cgroup_memory(files_).has_value());
  EXPECT_EQ(available_memory_bytes(files_), 10 * kGiB);
}

TEST_F(SysinfoTest, UsageOverTheLimitLeavesNoRoom) {
  self_cgroup("4:memory:/a\n");
  v1("a", kGiB, kGiB + 4096, 0, 0);
  EXPECT_EQ(available_memory_bytes(files_), 0);
}

TEST_F(SysinfoTest, TheCgroupRootComesFromTheEnvironment) {
  write(root_ / "env" / "cgroup.controllers", "memory\n");
  v2("../env", std::to_string(kGiB), 0, 0, 0);
  self_cgroup("0::/\n");
  SystemFiles files;
  files.proc = files_.proc;
  ::setenv("DUET_CGROUP_DIR", (root_ / "env").c_str(), 1);
  EXPECT_EQ(files.cgroup_root(), (root_ / "env").string());
  EXPECT_EQ(available_memory_bytes(files), kGiB);
  ::unsetenv("DUET_CGROUP_DIR");
  EXPECT_EQ(files.cgroup_root(), "/sys/fs/cgroup");
}

TEST_F(SysinfoTest, ProcessMemoryFromStatus) {
  write(root_ / "proc" / "self" / "status",
        "Name:\tduet\nVmPeak:\t 9999 kB\nVmRSS:\t    3072 kB\nRssAnon:\t    2048 kB\nRssFile:\t    1024 kB\n"
        "RssShmem:\t       0 kB\n");
  const ProcessMemory m = process_memory(files_);
  EXPECT_EQ(m.resident_bytes, 3 * kMiB);
  EXPECT_EQ(m.anonymous_bytes, 2 * kMiB);
  EXPECT_EQ(m.file_bytes, kMiB);
}

// This process, measured: 64 MiB touched show in RssAnon, and leave it when unmapped.
TEST(ProcessMemory, MeasuresThisProcess) {
  const size_t bytes = 64 << 20;
  const ProcessMemory before = process_memory();
  ASSERT_GT(before.resident_bytes, 0);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 1, bytes);
  const ProcessMemory touched = process_memory();
  EXPECT_GE(touched.anonymous_bytes - before.anonymous_bytes, 60 * kMiB);
  EXPECT_GE(touched.resident_bytes - before.resident_bytes, 60 * kMiB);
  ::munmap(p, bytes);
  EXPECT_LT(process_memory().anonymous_bytes, touched.anonymous_bytes - 60 * kMiB);
}

// This machine's own figures: some memory available, never more than the host has.
TEST(AvailableMemory, ThisMachine) {
  const int64_t available = available_memory_bytes();
  const int64_t total = total_memory_bytes();
  EXPECT_GT(available, 0);
  EXPECT_GT(total, 0);
  EXPECT_LE(available, total);
}

}  // namespace
}  // namespace duet
