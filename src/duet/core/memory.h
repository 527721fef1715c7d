// Large zero-initialized buffers from anonymous memory maps: pages are committed on first
// touch (or by commit_pages), so a KV pool sized for the worst case costs only what is used.
#pragma once

#include <cstddef>
#include <new>
#include <span>
#include <utility>
#include <vector>

namespace duet {

// Storage from a 64-byte boundary, for scratch rows that vector kernels load: malloc's large
// blocks start 16 bytes past a page, so every 512-bit load of a row in them would span two cache
// lines (measured: MLA decode attention 13% slower on one thread).
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}  // NOLINT(google-explicit-constructor): rebinding
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t{64}); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const { return true; }
};
template <typename T>
using LineVector = std::vector<T, CacheLineAllocator<T>>;

class AnonymousMemory {
 public:
  AnonymousMemory() = default;
  // Throws kResourceExhausted naming the size when the map fails. With huge_pages, the buffer
  // starts on a 2 MiB boundary, its size is rounded up to 2 MiB, and the kernel is asked for
  // transparent huge pages (fewer TLB misses when a large buffer is streamed, as weights are at
  // every step); where they are not available the advice is ignored.
  explicit AnonymousMemory(size_t bytes, bool huge_pages = false);
  ~AnonymousMemory();
  AnonymousMemory(AnonymousMemory&& other) noexcept;
  AnonymousMemory& operator=(AnonymousMemory&& other) noexcept;
  AnonymousMemory(const AnonymousMemory&) = delete;
  AnonymousMemory& operator=(const AnonymousMemory&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  // The buffer holds a copy made at load (a weight converted from a checkpoint's format) that
  // may be discarded once something else serves it (see discard_copy).
  void allow_discard();

 private:
  void release();

  void* data_ = nullptr;
  size_t size_ = 0;
  bool discardable_ = false;
};

// Of `ranges` (start, bytes), the bytes that lie in file mappings (/proc/self/maps lists an inode
// for them): weights used in place from a model file, whose pages live in the kernel's page
// cache, which MemAvailable counts as free memory. 0 where it cannot be told.
size_t file_backed_bytes(std::span<const std::pair<const void*, size_t>> ranges);

// When [p, p + bytes) covers the whole of an AnonymousMemory buffer that allowed it, frees its
// pages and makes them unreadable (a read faults rather than seeing zeros), and returns the bytes
// freed; otherwise returns 0 and changes nothing. For a loader whose converted weight now lives
// in a packed copy the backend promises never to read the original of (Backend::packs).
size_t discard_copy(const void* p, size_t bytes);

// Advises the kernel that the whole pages inside [p, p + bytes) will not be read soon (a weight
// matrix that has been copied elsewhere): clean file-backed pages leave this process's resident
// memory (the kernel may keep them in its page cache, which it drops first when memory is short)
// and are read again if touched. Nothing is lost; anonymous pages stay where there is no swap;
// where the advice is not supported it does nothing.
void release_pages(const void* p, size_t bytes);
// Gives the whole pages inside [p, p + bytes) of private anonymous memory back to the system,
// contents discarded (MADV_DONTNEED): they read as zeros when touched again. For memory whose
// contents are no longer wanted (KV blocks taken out of the pool).
void discard_pages(void* p, size_t bytes);
// Commits the whole pages inside [p, p + bytes) of private anonymous memory now, as a first write
// would, their contents unchanged (MADV_POPULATE_WRITE): for memory that will be written soon on a
// path that should not stop for page faults (the KV blocks the first steps take). Returns false,
// changing nothing, where the kernel cannot (before Linux 5.14) or has no memory left to give;
// the pages are then committed at their first write as before.
bool commit_pages(void* p, size_t bytes);

// Bytes of the pages covering [p, p + bytes) that this process holds in memory now (present in
// its page tables, /proc/self/pagemap): what its resident size (VmRSS) counts of the range. A file
// page that is only in the kernel's page cache does not count. 0 where it cannot be told.
size_t resident_bytes(const void* p, size_t bytes);

}  // namespace duet
