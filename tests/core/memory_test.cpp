// AnonymousMemory with huge pages: the buffer starts on a 2 MiB boundary, spans whole 2 MiB
// pages, and every byte of it is this process's own mapping (never past the reservation). What
// resident_bytes sees of anonymous and file pages, and release_pages taking a file's pages out of
// memory without losing them.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "duet/core/mapped_file.h"
#include "duet/core/memory.h"

namespace duet {
namespace {

// Whether [begin, end) is covered by the mappings listed in /proc/self/maps.
bool mapped(uintptr_t begin, uintptr_t end) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    uintptr_t a = 0, b = 0;
    char dash = 0;
    in >> std::hex >> a >> dash >> b;
    ranges.emplace_back(a, b);
  }
  uintptr_t at = begin;
  for (bool grew = true; grew && at < end;) {
    grew = false;
    for (const auto& [a, b] : ranges) {
      if (a <= at && at < b) {
        at = b;
        grew = true;
      }
    }
  }
  return at >= end;
}

TEST(AnonymousMemory, HugePageBuffersAreAlignedAndOwned) {
  constexpr size_t kHuge = size_t{2} << 20;
  std::vector<AnonymousMemory> held;
  for (size_t bytes : {size_t{1}, size_t{3} << 20, (size_t{5} << 20) + 4096, kHuge}) {
    for (int i = 0; i < 6; ++i) {
      AnonymousMemory m(bytes, /*huge_pages=*/true);
      const auto p = reinterpret_cast<uintptr_t>(m.data());
      EXPECT_EQ(p % kHuge, 0u) << bytes;
      EXPECT_GE(m.size(), bytes);
      EXPECT_EQ(m.size() % kHuge, 0u);
      EXPECT_LT(m.size() - bytes, kHuge);
      ASSERT_TRUE(mapped(p, p + m.size())) << "bytes " << bytes << ": the buffer runs past its own mapping";
      static_cast<uint8_t*>(m.data())[m.size() - 1] = 1;
      held.push_back(std::move(m));
    }
  }
  AnonymousMemory plain(100);
  EXPECT_EQ(plain.size(), 100u);
}

TEST(ResidentBytes, AnonymousPagesCountOnceTouched) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  AnonymousMemory m(64 * page);
  EXPECT_EQ(resident_bytes(m.data(), m.size()), 0u);
  std::memset(m.data(), 1, 10 * page);
  EXPECT_EQ(resident_bytes(m.data(), m.size()), 10 * page);
  EXPECT_EQ(resident_bytes(static_cast<uint8_t*>(m.data()) + 9 * page + 1, 2), page);
}

// commit_pages commits the whole pages inside the range, keeps what a page already held, and
// leaves the pages around it alone.
TEST(CommitPages, CommitsTheWholePagesInsideAndKeepsContents) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  AnonymousMemory m(64 * page);
  auto* p = static_cast<uint8_t*>(m.data());
  p[2 * page + 5] = 7;
  ASSERT_EQ(resident_bytes(p, m.size()), page);
  // Pages 4..12 lie wholly inside [3 pages + 1, 13 pages + 1).
  ASSERT_TRUE(commit_pages(p + 3 * page + 1, 10 * page)) << "MADV_POPULATE_WRITE needs Linux 5.14 or later";
  EXPECT_EQ(resident_bytes(p + 4 * page, 9 * page), 9 * page);
  EXPECT_EQ(resident_bytes(p, m.size()), 10 * page) << "only page 2 and the nine inside";
  ASSERT_TRUE(commit_pages(p + 2 * page, page));
  EXPECT_EQ(p[2 * page + 5], 7) << "a committed page keeps what it held";
  EXPECT_EQ(p[4 * page], 0);
  EXPECT_EQ(p[12 * page + page - 1], 0);
  ASSERT_TRUE(commit_pages(p + page + 1, page - 2)) << "no whole page inside: nothing to do";
  EXPECT_EQ(resident_bytes(p + page, page), 0u);
}

// A file's pages, touched through a mapping, leave the process's resident memory when released,
// and read back unchanged when touched again.
TEST(ReleasePages, FilePagesLeaveMemoryAndReadBack) {
  namespace fs = std::filesystem;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t bytes = 256 * page;
  const fs::path path = fs::temp_directory_path() / ("duet-memory-test-" + std::to_string(::getpid()));
  std::vector<uint8_t> content(bytes);
  for (size_t i = 0; i < bytes; ++i) content[i] = static_cast<uint8_t>(i * 7 + i / page);
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, content.data(), bytes), static_cast<ssize_t>(bytes));
  ASSERT_EQ(::fsync(fd), 0);  // dirty pages are written back, not released
  std::vector<uint8_t> read_back(bytes);
  ASSERT_EQ(::pread(fd, read_back.data(), bytes, 0), static_cast<ssize_t>(bytes));  // into the page cache
  ::close(fd);
  {
    const MappedFile f(path.string());
    EXPECT_EQ(resident_bytes(f.data(), bytes), 0u) << "pages in the page cache only are not the process's";
    // Touched through the mapping, then released but for the half pages at each end (the kernel
    // may take those too, with the large folio they share).
    size_t sum = 0;
    for (size_t i = 0; i < bytes; i += page) sum += f.data()[i];
    EXPECT_GT(sum, 0u);
    EXPECT_EQ(resident_bytes(f.data(), bytes), bytes);
    release_pages(f.data() + page / 2, bytes - page);
    EXPECT_EQ(resident_bytes(f.data() + page, bytes - 2 * page), 0u);
    EXPECT_EQ(std::memcmp(f.data(), content.data(), bytes), 0);
    EXPECT_EQ(resident_bytes(f.data(), bytes), bytes);
  }
  fs::remove(path);
}

// The permissions /proc/self/maps lists for the mapping holding `p` ("rw-p", "---p"), empty if none.
std::string permissions_at(const void* p) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto at = reinterpret_cast<uintptr_t>(p);
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    uintptr_t a = 0, b = 0;
    char dash = 0;
    std::string perms;
    in >> std::hex >> a >> dash >> b >> perms;
    if (a <= at && at < b) return perms;
  }
  return "";
}

// A converted copy that allowed it is discarded whole: its pages leave memory and cannot be read;
// any other buffer, a part of one, or one discarded already is left as it is.
TEST(DiscardCopy, OnlyWholeBuffersThatAllowedIt) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t bytes = 40 * page + 100;
  AnonymousMemory copy(bytes);
  AnonymousMemory other(bytes);
  std::memset(copy.data(), 7, bytes);
  std::memset(other.data(), 9, bytes);
  EXPECT_EQ(discard_copy(copy.data(), bytes), 0u) << "it did not allow it yet";
  copy.allow_discard();
  EXPECT_EQ(discard_copy(copy.data(), bytes - 1), 0u) << "a part of it";
  EXPECT_EQ(discard_copy(static_cast<uint8_t*>(copy.data()) + page, bytes - page), 0u) << "a part of it";
  EXPECT_EQ(discard_copy(other.data(), bytes), 0u) << "another buffer";
  EXPECT_EQ(resident_bytes(copy.data(), bytes), 41 * page);
  EXPECT_EQ(permissions_at(copy.data()), "rw-p");

  AnonymousMemory moved = std::move(copy);  // the permission goes with the buffer
  EXPECT_EQ(discard_copy(moved.data(), bytes), bytes);
  EXPECT_EQ(resident_bytes(moved.data(), bytes), 0u);
  EXPECT_EQ(permissions_at(moved.data()), "---p");
  EXPECT_EQ(discard_copy(moved.data(), bytes), 0u) << "already discarded";
  EXPECT_EQ(static_cast<uint8_t*>(other.data())[bytes - 1], 9) << "the other buffer is untouched";
  EXPECT_EQ(resident_bytes(other.data(), bytes), 41 * page);
  const void* where = moved.data();
  moved = AnonymousMemory();  // unmapped and forgotten
  EXPECT_EQ(discard_copy(where, bytes), 0u);
}

// A mapped file's bytes are file-backed, anonymous memory's are not.
TEST(FileBackedBytes, MappedFilesOnly) {
  namespace fs = std::filesystem;
  const fs::path path = fs::temp_directory_path() / ("duet-memory-file-test-" + std::to_string(::getpid()));
  std::ofstream(path) << std::string(3 * 4096 + 10, 'x');
  {
    const MappedFile f(path.string());
    AnonymousMemory m(5000);
    const std::pair<const void*, size_t> file{f.data(), f.size()}, part{f.data() + 100, 1000}, anon{m.data(), 5000};
    EXPECT_EQ(file_backed_bytes(std::vector{file}), f.size());
    EXPECT_EQ(file_backed_bytes(std::vector{anon}), 0u);
    EXPECT_EQ(file_backed_bytes(std::vector{file, part, anon}), f.size() + 1000);
    EXPECT_EQ(file_backed_bytes({}), 0u);
  }
  fs::remove(path);
}

// LineVector's storage starts on a cache line at every size and keeps doing so as it grows (a
// plain vector's storage is only 16-byte aligned: small ones anywhere on malloc's 16-byte grid,
// those of 128 KiB or more in mapped blocks 16 bytes past a page).
TEST(MemoryTest, LineVectorStartsOnACacheLine) {
  for (size_t n : {size_t{1}, size_t{15}, size_t{576}, size_t{75776}, size_t{1} << 20}) {
    LineVector<float> v(n, 1.0f);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % 64, 0u) << n;
    v.resize(3 * n + 5, 2.0f);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % 64, 0u) << n;
    EXPECT_EQ(v[n - 1], 1.0f);
    EXPECT_EQ(v[3 * n + 4], 2.0f);
  }
}

}  // namespace
}  // namespace duet
