// EnergyMeter on a powercap tree written here (the layout of /sys/class/powercap): package zones
// count for "cpu", their sub-zones do not, wraps at max_energy_range_uj are counted, and a tree
// without package zones (or no tree) gives no meter at all.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "duet/core/energy.h"

namespace duet {
namespace {

namespace fs = std::filesystem;

class EnergyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("duet-energy-test-" + std::to_string(::getpid()));
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  void zone(const std::string& dir, const std::string& name, uint64_t energy_uj, uint64_t max_uj) {
    fs::create_directories(root_ / dir);
    std::ofstream(root_ / dir / "name") << name << "\n";
    std::ofstream(root_ / dir / "max_energy_range_uj") << max_uj << "\n";
    set(dir, energy_uj);
  }
  void set(const std::string& dir, uint64_t energy_uj) { std::ofstream(root_ / dir / "energy_uj") << energy_uj << "\n"; }

  fs::path root_;
};

TEST_F(EnergyTest, PackagesCountWrapsAreCounted) {
  zone("intel-rapl:0", "package-0", 1'000'000, 10'000'000);
  zone("intel-rapl:0:0", "core", 500'000, 10'000'000);  // a part of package 0: not added again
  zone("intel-rapl:1", "package-1", 9'000'000, 10'000'000);
  zone("intel-rapl:2", "psys", 1, 10'000'000);  // not a package
  EnergyMeter meter(root_.string());
  ASSERT_TRUE(meter.available());
  auto j = meter.joules();
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0].first, "cpu");
  EXPECT_DOUBLE_EQ(j[0].second, 0.0);
  set("intel-rapl:0", 2'500'000);      // +1.5 J
  set("intel-rapl:0:0", 9'000'000);    // ignored
  set("intel-rapl:1", 500'000);        // wrapped: +1.0 J to the top, +0.5 J after it
  j = meter.joules();
  EXPECT_NEAR(j[0].second, 3.0, 1e-9);
  set("intel-rapl:0", 2'500'000);      // no change
  j = meter.joules();
  EXPECT_NEAR(j[0].second, 3.0, 1e-9);
}

TEST_F(EnergyTest, NoCountersNoMeter) {
  EXPECT_FALSE(EnergyMeter((root_ / "missing").string()).available());
  zone("intel-rapl:0:0", "core", 1, 10);  // only a sub-zone
  zone("intel-rapl:1", "package-1", 1, 0);  // no range: unusable
  fs::create_directories(root_ / "intel-rapl:2");
  std::ofstream(root_ / "intel-rapl:2" / "name") << "package-2\n";  // no energy_uj (unreadable)
  EnergyMeter meter(root_.string());
  EXPECT_FALSE(meter.available());
  EXPECT_TRUE(meter.joules().empty());
}

}  // namespace
}  // namespace duet
