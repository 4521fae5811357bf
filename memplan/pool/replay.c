/* memplan replay allocator: hands out offline-planned pool offsets by allocation order.
 *
 * One block of the planned pool size is reserved up front. The i-th allocation request of an
 * iteration gets planned slot i (base + offset[i]) when its size matches the plan and no
 * live buffer overlaps that range; otherwise it falls back to a plain device allocation and
 * the mismatch is counted. memplan_new_iteration() restarts the sequence.
 *
 * Backends: built with -DMEMPLAN_HOST_BACKEND it uses malloc/free (tests on CPU); otherwise
 * cudaMalloc/cudaFree are resolved at run time from the CUDA runtime already loaded in the
 * process (no CUDA headers needed to build). The malloc/free entry points have the signatures
 * torch.cuda.memory.CUDAPluggableAllocator expects.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

typedef struct {
  int64_t planned_hits;      /* requests served from their planned slot */
  int64_t fallbacks;         /* requests served by a plain device allocation */
  int64_t size_mismatches;   /* fallbacks because the size differed from the plan */
  int64_t extra_requests;    /* fallbacks because the iteration had more requests than planned */
  int64_t overlap_conflicts; /* fallbacks because a live buffer still used the planned range */
  int64_t iterations;        /* memplan_new_iteration calls */
  int64_t live_bytes;        /* bytes currently handed out (planned + fallback) */
  int64_t peak_live_bytes;   /* most bytes handed out at once */
  int64_t fallback_live_bytes; /* bytes currently held by fallback allocations */
  int64_t peak_reserved_bytes; /* pool block + most fallback bytes held at once */
} memplan_stats;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char *pool_base = NULL;
static int64_t pool_bytes = 0;
static int64_t n_slots = 0;
static int64_t *slot_size = NULL, *slot_offset = NULL;
static unsigned char *slot_live = NULL;
static int64_t next_slot = 0;
static memplan_stats stats;

#ifdef MEMPLAN_HOST_BACKEND
static int device_alloc(void **ptr, size_t size) { *ptr = malloc(size ? size : 1); return *ptr ? 0 : 2; }
static int device_free(void *ptr) { free(ptr); return 0; }
#else
typedef int (*cuda_malloc_fn)(void **, size_t);
typedef int (*cuda_free_fn)(void *);
static cuda_malloc_fn cuda_malloc = NULL;
static cuda_free_fn cuda_free = NULL;
static const char *CUDART_NAMES[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", NULL};

static int resolve_cuda(void) {
  if (cuda_malloc && cuda_free) return 0;
  void *handle = RTLD_DEFAULT;
  cuda_malloc = (cuda_malloc_fn)dlsym(handle, "cudaMalloc");
  cuda_free = (cuda_free_fn)dlsym(handle, "cudaFree");
  for (int i = 0; CUDART_NAMES[i] && !(cuda_malloc && cuda_free); i++) {
    handle = dlopen(CUDART_NAMES[i], RTLD_NOW | RTLD_NOLOAD);
    if (!handle) handle = dlopen(CUDART_NAMES[i], RTLD_NOW);
    if (!handle) continue;
    cuda_malloc = (cuda_malloc_fn)dlsym(handle, "cudaMalloc");
    cuda_free = (cuda_free_fn)dlsym(handle, "cudaFree");
  }
  return (cuda_malloc && cuda_free) ? 0 : 1;
}
static int device_alloc(void **ptr, size_t size) { return resolve_cuda() ? 1 : cuda_malloc(ptr, size); }
static int device_free(void *ptr) { return resolve_cuda() ? 1 : cuda_free(ptr); }
#endif

static void note_live(int64_t delta, int fallback) {
  stats.live_bytes += delta;
  if (stats.live_bytes > stats.peak_live_bytes) stats.peak_live_bytes = stats.live_bytes;
  if (fallback) {
    stats.fallback_live_bytes += delta;
    int64_t reserved = pool_bytes + stats.fallback_live_bytes;
    if (reserved > stats.peak_reserved_bytes) stats.peak_reserved_bytes = reserved;
  }
}

static int overlaps_live(int64_t lo, int64_t hi) {
  for (int64_t k = 0; k < n_slots; k++)
    if (slot_live[k] && slot_offset[k] < hi && lo < slot_offset[k] + slot_size[k]) return 1;
  return 0;
}

/* Reserve the pool and load the planned sequence. Returns 0 on success. */
int memplan_configure(int64_t bytes, int64_t n, const int64_t *sizes, const int64_t *offsets) {
  pthread_mutex_lock(&lock);
  int rc = 0;
  if (pool_base) { device_free(pool_base); pool_base = NULL; }
  free(slot_size); free(slot_offset); free(slot_live);
  slot_size = malloc(sizeof(int64_t) * (n ? n : 1));
  slot_offset = malloc(sizeof(int64_t) * (n ? n : 1));
  slot_live = calloc(n ? n : 1, 1);
  memcpy(slot_size, sizes, sizeof(int64_t) * n);
  memcpy(slot_offset, offsets, sizeof(int64_t) * n);
  n_slots = n; pool_bytes = bytes; next_slot = 0;
  memset(&stats, 0, sizeof(stats));
  stats.peak_reserved_bytes = bytes;
  if (bytes > 0 && device_alloc((void **)&pool_base, (size_t)bytes) != 0) { pool_base = NULL; pool_bytes = 0; rc = 1; }
  pthread_mutex_unlock(&lock);
  return rc;
}

/* Start a new iteration: the next request is planned slot 0 again. */
void memplan_new_iteration(void) {
  pthread_mutex_lock(&lock);
  next_slot = 0;
  stats.iterations++;
  pthread_mutex_unlock(&lock);
}

void *memplan_malloc(ssize_t size, int device, void *stream) {
  (void)device; (void)stream;
  pthread_mutex_lock(&lock);
  void *out = NULL;
  int64_t k = next_slot++;
  if (pool_base && k < n_slots && slot_size[k] == size &&
      !overlaps_live(slot_offset[k], slot_offset[k] + slot_size[k])) {
    slot_live[k] = 1;
    stats.planned_hits++;
    out = pool_base + slot_offset[k];
    note_live(size, 0);
  } else {
    if (k >= n_slots) stats.extra_requests++;
    else if (slot_size[k] != size) stats.size_mismatches++;
    else stats.overlap_conflicts++;
    stats.fallbacks++;
    if (device_alloc(&out, (size_t)size) != 0) out = NULL;
    if (out) note_live(size, 1);
  }
  pthread_mutex_unlock(&lock);
  return out;
}

void memplan_free(void *ptr, ssize_t size, int device, void *stream) {
  (void)device; (void)stream;
  pthread_mutex_lock(&lock);
  char *p = (char *)ptr;
  if (pool_base && p >= pool_base && p < pool_base + pool_bytes) {
    int64_t off = p - pool_base;
    for (int64_t k = 0; k < n_slots; k++) {
      if (slot_live[k] && slot_offset[k] == off) { slot_live[k] = 0; note_live(-slot_size[k], 0); break; }
    }
  } else if (p) {
    device_free(p);
    note_live(-(int64_t)size, 1);
  }
  pthread_mutex_unlock(&lock);
}

/* Copy the statistics out. */
void memplan_get_stats(memplan_stats *out) {
  pthread_mutex_lock(&lock);
  *out = stats;
  pthread_mutex_unlock(&lock);
}

/* Base address of the pool block (0 if none). */
uintptr_t memplan_pool_base(void) { return (uintptr_t)pool_base; }
