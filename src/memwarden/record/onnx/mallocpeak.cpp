// A malloc-level byte counter, loaded with LD_PRELOAD into a measurement subprocess
// (memwarden.record.onnx.mallocpeak). Every allocation entry point of the C library is wrapped:
// the live count rises by the block's usable size on allocation and falls by it on free, and the
// highest live count since the last reset is kept. ONNX Runtime's CPU allocator with the arena off
// is posix_memalign/free per tensor, so the peak over a session.run is the bytes that run held.
//
// Sizes are malloc_usable_size (the request rounded up to the allocator's granule: 16 B, or a page
// for mmap'd blocks), so the count needs no table of its own and stays consistent between the
// allocation and the free of one block. glibc only: the real functions are its __libc_* exports.

#include <errno.h>
#include <malloc.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

extern "C" {
void* __libc_malloc(size_t);
void __libc_free(void*);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
}

static int64_t g_live = 0;  // bytes in live blocks, as usable sizes
static int64_t g_peak = 0;  // highest g_live since the last reset

static inline void count_alloc(void* p) {
  if (!p) return;
  int64_t now = __atomic_add_fetch(&g_live, (int64_t)malloc_usable_size(p), __ATOMIC_RELAXED);
  int64_t peak = __atomic_load_n(&g_peak, __ATOMIC_RELAXED);
  while (now > peak && !__atomic_compare_exchange_n(&g_peak, &peak, now, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

static inline void count_free(void* p) {
  if (p) __atomic_sub_fetch(&g_live, (int64_t)malloc_usable_size(p), __ATOMIC_RELAXED);
}

extern "C" {

// The counter's interface, found through ctypes.CDLL(None) in the measured process.
__attribute__((visibility("default"))) int64_t memwarden_mallocpeak_live(void) {
  return __atomic_load_n(&g_live, __ATOMIC_RELAXED);
}
__attribute__((visibility("default"))) int64_t memwarden_mallocpeak_peak(void) {
  return __atomic_load_n(&g_peak, __ATOMIC_RELAXED);
}
__attribute__((visibility("default"))) int64_t memwarden_mallocpeak_reset(void) {
  int64_t now = __atomic_load_n(&g_live, __ATOMIC_RELAXED);
  __atomic_store_n(&g_peak, now, __ATOMIC_RELAXED);
  return now;
}

__attribute__((visibility("default"))) void* malloc(size_t size) {
  void* p = __libc_malloc(size);
  count_alloc(p);
  return p;
}

__attribute__((visibility("default"))) void free(void* p) {
  count_free(p);
  __libc_free(p);
}

__attribute__((visibility("default"))) void* calloc(size_t n, size_t size) {
  void* p = __libc_calloc(n, size);
  count_alloc(p);
  return p;
}

__attribute__((visibility("default"))) void* realloc(void* old, size_t size) {
  size_t before = old ? malloc_usable_size(old) : 0;
  void* p = __libc_realloc(old, size);
  if (p) {
    __atomic_sub_fetch(&g_live, (int64_t)before, __ATOMIC_RELAXED);
    count_alloc(p);
  } else if (size == 0 && old) {  // realloc(p, 0) freed p
    __atomic_sub_fetch(&g_live, (int64_t)before, __ATOMIC_RELAXED);
  }
  return p;
}

__attribute__((visibility("default"))) void* memalign(size_t alignment, size_t size) {
  void* p = __libc_memalign(alignment, size);
  count_alloc(p);
  return p;
}

__attribute__((visibility("default"))) int posix_memalign(void** out, size_t alignment, size_t size) {
  if (alignment % sizeof(void*) != 0 || (alignment & (alignment - 1)) != 0) return EINVAL;
  void* p = __libc_memalign(alignment, size);
  if (!p && size) return ENOMEM;
  count_alloc(p);
  *out = p;
  return 0;
}

__attribute__((visibility("default"))) void* aligned_alloc(size_t alignment, size_t size) {
  void* p = __libc_memalign(alignment, size);
  count_alloc(p);
  return p;
}

__attribute__((visibility("default"))) void* valloc(size_t size) {
  void* p = __libc_memalign((size_t)sysconf(_SC_PAGESIZE), size);
  count_alloc(p);
  return p;
}

__attribute__((visibility("default"))) void* pvalloc(size_t size) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  void* p = __libc_memalign(page, (size + page - 1) / page * page);
  count_alloc(p);
  return p;
}

}  // extern "C"
