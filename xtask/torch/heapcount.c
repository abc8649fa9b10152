/* Live and peak heap bytes of a process, for the PyTorch side of `cargo xtask bench --torch`:
 * preloaded (LD_PRELOAD), it wraps glibc's allocator as the Rust bench's counting global
 * allocator wraps the system one, and exports heapcount_live / heapcount_peak /
 * heapcount_reset_peak, which twins.py reads through ctypes. Sizes are malloc_usable_size's. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stddef.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

static _Atomic size_t live_bytes, peak_bytes;

static void *counted(void *p) {
    if (p) {
        size_t now = atomic_fetch_add(&live_bytes, malloc_usable_size(p)) + malloc_usable_size(p);
        size_t peak = atomic_load(&peak_bytes);
        while (now > peak && !atomic_compare_exchange_weak(&peak_bytes, &peak, now)) {
        }
    }
    return p;
}

static void uncount(void *p) {
    if (p) atomic_fetch_sub(&live_bytes, malloc_usable_size(p));
}

void *malloc(size_t n) { return counted(__libc_malloc(n)); }
void *calloc(size_t n, size_t size) { return counted(__libc_calloc(n, size)); }
void free(void *p) { uncount(p); __libc_free(p); }
void *memalign(size_t align, size_t n) { return counted(__libc_memalign(align, n)); }
void *aligned_alloc(size_t align, size_t n) { return counted(__libc_memalign(align, n)); }

void *realloc(void *p, size_t n) {
    size_t old = p ? malloc_usable_size(p) : 0;
    void *q = __libc_realloc(p, n);
    if (q || n == 0) atomic_fetch_sub(&live_bytes, old);
    return q ? counted(q) : q;
}

int posix_memalign(void **out, size_t align, size_t n) {
    void *p = __libc_memalign(align, n);
    if (!p) return ENOMEM;
    *out = counted(p);
    return 0;
}

size_t heapcount_live(void) { return atomic_load(&live_bytes); }
size_t heapcount_peak(void) { return atomic_load(&peak_bytes); }
void heapcount_reset_peak(void) { atomic_store(&peak_bytes, atomic_load(&live_bytes)); }
