#include "duet/core/memory.h"

#include <fcntl.h>
#include <sys/mman.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <mutex>
#include <utility>
#include <vector>

#include "duet/core/error.h"

namespace duet {

AnonymousMemory::AnonymousMemory(size_t bytes, bool huge_pages) : size_(bytes) {
  if (bytes == 0) return;
  // Huge pages only cover whole 2 MiB-aligned stretches: reserve one more, start on a boundary
  // and give back the rest, keeping the buffer's end in its last huge page.
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  // An aligned start lies less than kHuge past the map's, so [begin, begin + rounded) fits.
  const size_t reserve = huge_pages ? rounded + kHuge : bytes;
  void* p = ::mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    fail(ErrorCode::kResourceExhausted, "cannot reserve {} bytes of memory: {}", bytes, std::strerror(errno));
  }
  data_ = p;
  if (!huge_pages) return;
  const auto base = reinterpret_cast<uintptr_t>(p);
  const uintptr_t begin = (base + kHuge - 1) / kHuge * kHuge;
  const uintptr_t end = begin + rounded;
  if (begin > base) ::munmap(p, begin - base);
  if (base + reserve > end) ::munmap(reinterpret_cast<void*>(end), base + reserve - end);
  data_ = reinterpret_cast<void*>(begin);
  size_ = end - begin;
#ifdef MADV_HUGEPAGE
  ::madvise(data_, size_, MADV_HUGEPAGE);
#endif
}

namespace {

// madvise(advice) over the whole pages inside [p, p + bytes); true when it succeeded or no whole
// page lies inside.
bool advise_whole_pages(const void* p, size_t bytes, int advice) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) / page * page;
  return end <= begin || ::madvise(reinterpret_cast<void*>(begin), end - begin, advice) == 0;
}

// The buffers that allowed discard_copy, by address: their size, and whether they are discarded.
struct Discardable {
  std::mutex mutex;
  std::map<const void*, std::pair<size_t, bool>> buffers;
};
Discardable& discardable() {
  static Discardable d;
  return d;
}

}  // namespace

AnonymousMemory::~AnonymousMemory() { release(); }

void AnonymousMemory::release() {
  if (data_ == nullptr) return;
  if (discardable_) {
    Discardable& d = discardable();
    const std::lock_guard<std::mutex> lock(d.mutex);
    d.buffers.erase(data_);
  }
  ::munmap(data_, size_);  // unmaps discarded (unreadable) pages too
  data_ = nullptr;
  discardable_ = false;
}

AnonymousMemory::AnonymousMemory(AnonymousMemory&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      discardable_(std::exchange(other.discardable_, false)) {}

AnonymousMemory& AnonymousMemory::operator=(AnonymousMemory&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    discardable_ = std::exchange(other.discardable_, false);
  }
  return *this;
}

void AnonymousMemory::allow_discard() {
  if (data_ == nullptr || discardable_) return;
  Discardable& d = discardable();
  const std::lock_guard<std::mutex> lock(d.mutex);
  d.buffers[data_] = {size_, false};
  discardable_ = true;
}

size_t file_backed_bytes(std::span<const std::pair<const void*, size_t>> ranges) {
  if (ranges.empty()) return 0;
  std::vector<std::pair<uintptr_t, uintptr_t>> files;  // [begin, end) of every file mapping
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::string perms, offset, device;
    uint64_t inode = 0;
    in >> std::hex >> begin >> dash >> end >> perms >> offset >> device >> std::dec >> inode;
    if (in && inode != 0) files.emplace_back(begin, end);
  }
  size_t total = 0;
  for (const auto& [p, bytes] : ranges) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    const uintptr_t b = a + bytes;
    for (const auto& [begin, end] : files) {
      if (begin < b && a < end) total += std::min(b, end) - std::max(a, begin);
    }
  }
  return total;
}

size_t discard_copy(const void* p, size_t bytes) {
  Discardable& d = discardable();
  const std::lock_guard<std::mutex> lock(d.mutex);
  auto it = d.buffers.find(p);
  if (it == d.buffers.end() || bytes < it->second.first || it->second.second) return 0;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t span = (it->second.first + page - 1) / page * page;
  void* begin = const_cast<void*>(p);
  if (::madvise(begin, span, MADV_DONTNEED) != 0) return 0;
  ::mprotect(begin, span, PROT_NONE);
  it->second.second = true;
  return it->second.first;
}

void release_pages(const void* p, size_t bytes) {
#ifdef MADV_PAGEOUT
  (void)advise_whole_pages(p, bytes, MADV_PAGEOUT);
#else
  (void)p;
  (void)bytes;
#endif
}

void discard_pages(void* p, size_t bytes) { (void)advise_whole_pages(p, bytes, MADV_DONTNEED); }

bool commit_pages(void* p, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  constexpr int kPopulateWrite = MADV_POPULATE_WRITE;
#else
  constexpr int kPopulateWrite = 23;  // Linux 5.14's value, for headers older than the kernel
#endif
  return advise_whole_pages(p, bytes, kPopulateWrite);
}

size_t resident_bytes(const void* p, size_t bytes) {
  if (bytes == 0) return 0;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) / page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(p) + bytes - 1) / page;
  // One 64-bit entry per page; bit 63: the page is present in this process's page tables.
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  std::vector<uint64_t> entries(4096);
  size_t resident = 0;
  for (uintptr_t at = first; at <= last;) {
    const size_t n = std::min<size_t>(entries.size(), last - at + 1);
    const ssize_t got = ::pread(fd, entries.data(), n * sizeof(uint64_t), static_cast<off_t>(at * sizeof(uint64_t)));
    if (got != static_cast<ssize_t>(n * sizeof(uint64_t))) break;
    for (size_t i = 0; i < n; ++i) resident += (entries[i] >> 63) != 0 ? page : 0;
    at += n;
  }
  ::close(fd);
  return resident;
}

}  // namespace duet
