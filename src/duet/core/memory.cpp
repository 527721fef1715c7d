#include "duet/core/memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "duet/core/error.h"

namespace duet {

AnonymousMemory::AnonymousMemory(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    fail(ErrorCode::kResourceExhausted, "cannot reserve {} bytes of memory: {}", bytes, std::strerror(errno));
  }
  data_ = p;
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

}  // namespace duet
