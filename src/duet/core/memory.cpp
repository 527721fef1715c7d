#include "duet/core/memory.h"

#include <sys/mman.h>

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "duet/core/error.h"

namespace duet {

AnonymousMemory::AnonymousMemory(size_t bytes, bool huge_pages) : size_(bytes) {
  if (bytes == 0) return;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    fail(ErrorCode::kResourceExhausted, "cannot reserve {} bytes of memory: {}", bytes, std::strerror(errno));
  }
  data_ = p;
#ifdef MADV_HUGEPAGE
  if (huge_pages) ::madvise(p, bytes, MADV_HUGEPAGE);
#else
  (void)huge_pages;
#endif
}

AnonymousMemory::~AnonymousMemory() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

AnonymousMemory::AnonymousMemory(AnonymousMemory&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AnonymousMemory& AnonymousMemory::operator=(AnonymousMemory&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void release_pages(const void* p, size_t bytes) {
#ifdef MADV_PAGEOUT
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_PAGEOUT);
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace duet
