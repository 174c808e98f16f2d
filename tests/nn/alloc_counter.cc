// Replaces the global operator new of the test_nn binary with a counting one, so tests can assert
// that steady-state training steps do not allocate. In its own file: with the replacement visible,
// GCC's -Wmismatched-new-delete misfires on every new/delete pair in the same translation unit.
#include <cstdlib>
#include <new>

// ThreadSanitizer's runtime defines the global operator new itself (a second definition does not
// link): there the count stays 0 and the no-allocation checks pass trivially; the other builds
// (plain, ASan) count.
#if defined(__SANITIZE_THREAD__)
#define DTRAIN_COUNT_ALLOCATIONS 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DTRAIN_COUNT_ALLOCATIONS 0
#endif
#endif
#ifndef DTRAIN_COUNT_ALLOCATIONS
#define DTRAIN_COUNT_ALLOCATIONS 1
#endif

namespace dtrain_test {
namespace {
long g_allocations = 0;
}  // namespace

long allocations() {
  return g_allocations;
}

}  // namespace dtrain_test

#if DTRAIN_COUNT_ALLOCATIONS
void* operator new(std::size_t n) {
  ++dtrain_test::g_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}

void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
#endif  // DTRAIN_COUNT_ALLOCATIONS
