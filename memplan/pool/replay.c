/* memplan replay allocator: SmartPool's runtime (paper 000 §III) as a PyTorch CUDA allocator.
 *
 * One block of the planned pool size is reserved up front. While the allocator is armed (a
 * planned step runs), each request is matched to a planned slot by the op that makes it:
 * memplan's step runner publishes the trace index of the op it runs in `memplan_op` (one store
 * per op), and a request gets the first unserved slot of exactly its size that the plan starts
 * at that op (then at the next op, then at the previous one: an action the runner takes
 * between two ops). So a request the trace does not know (a library workspace) or a missing
 * or reordered one costs only itself, as PyTorch's selective checkpointing keys by op and
 * occurrence. A matched slot is served at base + offset when no live block overlaps that
 * range; everything else is served by the fallback heap and counted.
 *
 * NOTE safety -- the rules the code relies on:
 *  1. Live pool blocks never overlap: they are kept sorted by offset, and a slot whose range
 *     meets a live block falls back (a "conflict"), whatever the plan says.
 *  2. Only requests on the pool's stream (the compute stream given at arming) get slots, so
 *     every reuse of a range is ordered after the last use by that stream; a request on any
 *     other stream falls back. A pluggable allocator gets no record_stream calls: memplan's
 *     executor frees a block a copy reads only after the copy finished (exec/engine.py rule 5).
 *  3. The fallback heap is stream-ordered (cudaMallocAsync/cudaFreeAsync on the request's
 *     stream, cached by the device's default memory pool): unplanned requests never
 *     synchronize the device, as cudaFree would. The host backend uses malloc/free.
 *  4. Requests made while disarmed (before the plan exists, between steps) go to the heap and
 *     are counted apart ("outside"): they are not the plan's business.
 *  5. A request of the CUDA backend is served or the process ends (`out_of_memory`): PyTorch
 *     never sees a NULL for bytes it asked for.
 *
 * Backends: built with -DMEMPLAN_HOST_BACKEND it uses malloc/free (tests on CPU); otherwise
 * the CUDA runtime's functions are resolved at run time from the libcudart already loaded in
 * the process (memplan_load_cudart; no CUDA headers needed to build). memplan_malloc and
 * memplan_free have the signatures torch.cuda.memory.CUDAPluggableAllocator expects.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#define LOG_CAP 64       /* mismatches remembered from the verified iteration */

enum { MISS_UNPLANNED = 1, MISS_CONFLICT = 2, MISS_OTHER_STREAM = 3, MISS_NEVER_REQUESTED = 4 };

typedef struct {
  int64_t requests;          /* requests while armed */
  int64_t served;            /* of them, served at their planned slot */
  int64_t served_bytes;      /* their bytes */
  int64_t small;             /* requests below the smallest slot: the heap's by design, not fallbacks */
  int64_t unplanned;         /* no unserved slot of that size at that op */
  int64_t unplanned_bytes;   /* their bytes */
  int64_t conflicts;         /* a slot matched, but a live block still used its range */
  int64_t other_stream;      /* requests on a stream other than the pool's */
  int64_t outside;           /* requests while disarmed (served by the heap, not fallbacks) */
  int64_t missed_slots;      /* planned slots an iteration never requested (counted at its end) */
  int64_t iterations;        /* iterations begun */
  int64_t live_bytes;        /* bytes handed out now (pool and heap) */
  int64_t peak_live_bytes;   /* most bytes handed out at once since the last peak reset */
  int64_t heap_live_bytes;   /* bytes of the heap handed out now */
  int64_t peak_heap_live_bytes; /* most heap bytes handed out at once since the last peak reset */
  int64_t alloc_ns;          /* nanoseconds spent in memplan_malloc */
  int64_t free_ns;           /* nanoseconds spent in memplan_free */
} memplan_stats;

typedef struct {
  int64_t request;       /* request index within the iteration (-1: a slot never requested) */
  int64_t size;          /* requested bytes (0: a slot never requested) */
  int64_t op;            /* the op it was made at (or the slot's planned op) */
  int64_t slot;          /* the slot never requested (-1 for a request) */
  int64_t slot_size;     /* its planned bytes (-1 for a request) */
  int64_t kind;          /* MISS_* */
} memplan_miss;

typedef struct { int64_t off, end; } range_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char *pool_base = NULL;
static int64_t pool_bytes = 0, n_slots = 0;
static int64_t *slot_size = NULL, *slot_offset = NULL, *slot_op = NULL, *served_in = NULL;
static int64_t *op_first = NULL, n_ops = 0;  /* slots of op k: op_first[k] .. op_first[k + 1] - 1 */
static range_t *live = NULL;            /* live pool blocks, sorted by offset (rule 1) */
static int64_t n_live = 0, min_slot = 0;
static int64_t generation = 0, request_no = 0;
int64_t memplan_op = -1;                /* the op the step runner runs now (written by Python) */
static int armed = 0, verifying = 0;
static void *home_stream = NULL;
static memplan_stats stats;
static memplan_miss misses[LOG_CAP];
static int64_t n_misses = 0;

#ifdef MEMPLAN_HOST_BACKEND
static int block_alloc(void **ptr, size_t size) { *ptr = malloc(size ? size : 1); return *ptr ? 0 : 2; }
static void block_free(void *ptr) { free(ptr); }
static int heap_alloc(void **ptr, size_t size, void *stream) { (void)stream; return block_alloc(ptr, size); }
static void heap_free(void *ptr, void *stream) { (void)stream; free(ptr); }
int memplan_load_cudart(const char *path) { (void)path; return 0; }
int64_t memplan_heap_reserved(int high) { return high ? stats.peak_heap_live_bytes : stats.heap_live_bytes; }
static void heap_reset_peak(void) {}
#else
typedef int (*malloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);
typedef int (*malloc_async_fn)(void **, size_t, void *);
typedef int (*free_async_fn)(void *, void *);
typedef int (*get_device_fn)(int *);
typedef int (*default_pool_fn)(void **, int);
typedef int (*pool_attr_fn)(void *, int, void *);
static malloc_fn cuda_malloc;
static free_fn cuda_free;
static malloc_async_fn cuda_malloc_async;
static free_async_fn cuda_free_async;
static get_device_fn cuda_get_device;
static default_pool_fn cuda_default_pool;
static pool_attr_fn cuda_pool_get, cuda_pool_set;
enum { RELEASE_THRESHOLD = 4, RESERVED_CURRENT = 5, RESERVED_HIGH = 6 };  /* cudaMemPoolAttr */

static const char *CUDART_NAMES[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so", NULL};

/* The libcudart at `path` (the one PyTorch loaded), else one in the global scope, else any. */
static void *open_cudart(const char *path) {
  if (path) return dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  if (dlsym(RTLD_DEFAULT, "cudaMallocAsync")) return RTLD_DEFAULT;
  for (int i = 0; CUDART_NAMES[i]; i++) {
    void *h = dlopen(CUDART_NAMES[i], RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen(CUDART_NAMES[i], RTLD_NOW);
    if (h) return h;
  }
  return NULL;
}

/* Resolve the runtime functions. Returns 0 on success. */
int memplan_load_cudart(const char *path) {
  void *h = open_cudart(path);
  if (!h) return 1;
  cuda_malloc = (malloc_fn)dlsym(h, "cudaMalloc");
  cuda_free = (free_fn)dlsym(h, "cudaFree");
  cuda_malloc_async = (malloc_async_fn)dlsym(h, "cudaMallocAsync");
  cuda_free_async = (free_async_fn)dlsym(h, "cudaFreeAsync");
  cuda_get_device = (get_device_fn)dlsym(h, "cudaGetDevice");
  cuda_default_pool = (default_pool_fn)dlsym(h, "cudaDeviceGetDefaultMemPool");
  cuda_pool_get = (pool_attr_fn)dlsym(h, "cudaMemPoolGetAttribute");
  cuda_pool_set = (pool_attr_fn)dlsym(h, "cudaMemPoolSetAttribute");
  return (cuda_malloc && cuda_free && cuda_malloc_async && cuda_free_async && cuda_get_device &&
          cuda_default_pool && cuda_pool_get && cuda_pool_set) ? 0 : 2;
}

static void *default_pool(void) {
  void *mempool = NULL;
  int device = 0;
  if (!cuda_get_device || cuda_get_device(&device) || cuda_default_pool(&mempool, device)) return NULL;
  return mempool;
}
static int block_alloc(void **ptr, size_t size) { return cuda_malloc ? cuda_malloc(ptr, size) : 1; }
static void block_free(void *ptr) { if (cuda_free) cuda_free(ptr); }
static int heap_alloc(void **ptr, size_t size, void *stream) {
  static int ready = 0;
  if (!cuda_malloc_async) return 1;
  if (!ready) {  /* at first use, not at load: the device's context is PyTorch's to create */
    uint64_t keep_all = UINT64_MAX;  /* freed heap memory stays cached in the pool (rule 3) */
    void *mempool = default_pool();
    if (mempool) cuda_pool_set(mempool, RELEASE_THRESHOLD, &keep_all);
    ready = 1;
  }
  return cuda_malloc_async(ptr, size, stream);
}
static void heap_free(void *ptr, void *stream) { if (cuda_free_async) cuda_free_async(ptr, stream); }

/* Bytes the heap holds from the device now (high = 0) or at most since the last reset. */
int64_t memplan_heap_reserved(int high) {
  void *mempool = default_pool();
  uint64_t value = 0;
  if (!mempool || cuda_pool_get(mempool, high ? RESERVED_HIGH : RESERVED_CURRENT, &value)) return -1;
  return (int64_t)value;
}
static void heap_reset_peak(void) {
  void *mempool = default_pool();
  uint64_t zero = 0;
  if (mempool) cuda_pool_set(mempool, RESERVED_HIGH, &zero);
}
#endif

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void note_live(int64_t delta, int heap) {
  stats.live_bytes += delta;
  if (stats.live_bytes > stats.peak_live_bytes) stats.peak_live_bytes = stats.live_bytes;
  if (!heap) return;
  stats.heap_live_bytes += delta;
  if (stats.heap_live_bytes > stats.peak_heap_live_bytes) stats.peak_heap_live_bytes = stats.heap_live_bytes;
}

/* Index of the first live block ending after `lo` (blocks are disjoint: ends sorted too). */
static int64_t first_ending_after(int64_t lo) {
  int64_t a = 0, b = n_live;
  while (a < b) {
    int64_t m = (a + b) / 2;
    if (live[m].end > lo) b = m; else a = m + 1;
  }
  return a;
}

static int range_is_free(int64_t lo, int64_t hi) {
  int64_t i = first_ending_after(lo);
  return i == n_live || live[i].off >= hi;
}

static void live_insert(int64_t lo, int64_t hi) {
  int64_t i = first_ending_after(lo);
  memmove(live + i + 1, live + i, sizeof(range_t) * (size_t)(n_live - i));
  live[i].off = lo; live[i].end = hi;
  n_live++;
}

/* Remove the live block at offset `off`; returns its size, or -1 if none starts there. */
static int64_t live_remove(int64_t off) {
  int64_t i = first_ending_after(off);
  if (i == n_live || live[i].off != off) return -1;
  int64_t size = live[i].end - live[i].off;
  memmove(live + i, live + i + 1, sizeof(range_t) * (size_t)(n_live - i - 1));
  n_live--;
  return size;
}

static void log_miss(int64_t request, int64_t size, int64_t op, int64_t slot, int64_t kind) {
  if (!verifying || n_misses >= LOG_CAP) return;
  memplan_miss *m = &misses[n_misses++];
  m->request = request; m->size = size; m->op = op; m->slot = slot; m->kind = kind;
  m->slot_size = slot >= 0 ? slot_size[slot] : -1;
}

static int usable(int64_t j, int64_t size, int *blocked) {
  if (served_in[j] == generation || slot_size[j] != size) return 0;
  if (range_is_free(slot_offset[j], slot_offset[j] + size)) return 1;
  *blocked = 1;
  return 0;
}

/* The first unserved slot of `size` planned at the current op, the next or the previous one,
 * whose range is free (rules 1 and 2); -1 with *blocked set when a matching slot was in use. */
static int64_t match(int64_t size, int *blocked) {
  static const int64_t near[3] = {0, 1, -1};
  *blocked = 0;
  for (int k = 0; k < 3; k++) {
    int64_t op = memplan_op + near[k];
    if (op < 0 || op >= n_ops) continue;
    for (int64_t j = op_first[op]; j < op_first[op + 1]; j++)
      if (usable(j, size, blocked)) return j;
  }
  return -1;
}

/* The heap has no room: PyTorch's pluggable allocator uses what it gets unchecked (no null test in
 * CUDAPluggableAllocator.cpp), and a C function cannot raise its OutOfMemoryError, so a NULL would be
 * an illegal address far from here, poisoning the context. The CUDA backend ends the process with
 * one line instead (rule 5); the host backend, called by tests, returns NULL to its caller. */
static void *out_of_memory(size_t size) {
#ifdef MEMPLAN_HOST_BACKEND
  fprintf(stderr, "memplan pool: the host heap could not allocate %zu bytes\n", size);
  return NULL;
#else
  fprintf(stderr, "memplan pool: out of device memory: %zu bytes requested, %lld held (the plan's pool: %lld); "
          "PyTorch takes no null pointer from a pluggable allocator, so the process ends here\n",
          size, (long long)stats.live_bytes, (long long)pool_bytes);
  fflush(stderr);
  abort();
#endif
}

static void *serve_from_heap(size_t size, void *stream) {
  void *out = NULL;
  if (heap_alloc(&out, size ? size : 1, stream) != 0 || !out) return out_of_memory(size);
  note_live((int64_t)size, 1);
  return out;
}

static void *planned_malloc(int64_t size, void *stream) {
  int64_t k = request_no++, j = -1;
  int blocked = 0;
  stats.requests++;
  if (size < min_slot) {
    stats.small++;
  } else if (stream != home_stream) {
    stats.other_stream++;
    log_miss(k, size, memplan_op, -1, MISS_OTHER_STREAM);
  } else if ((j = match(size, &blocked)) < 0) {
    if (blocked) stats.conflicts++; else { stats.unplanned++; stats.unplanned_bytes += size; }
    log_miss(k, size, memplan_op, -1, blocked ? MISS_CONFLICT : MISS_UNPLANNED);
  }
  if (j < 0) return serve_from_heap((size_t)size, stream);
  served_in[j] = generation;
  live_insert(slot_offset[j], slot_offset[j] + size);
  stats.served++;
  stats.served_bytes += size;
  note_live(size, 0);
  return pool_base + slot_offset[j];
}

void *memplan_malloc(ssize_t size, int device, void *stream) {
  (void)device;
  if (size <= 0) return NULL;  /* PyTorch never frees a null data pointer */
  int64_t started = now_ns();
  pthread_mutex_lock(&lock);
  void *out;
  if (armed && pool_base) {
    out = planned_malloc((int64_t)size, stream);
  } else {
    stats.outside++;
    out = serve_from_heap((size_t)size, stream);
  }
  stats.alloc_ns += now_ns() - started;
  pthread_mutex_unlock(&lock);
  return out;
}

void memplan_free(void *ptr, ssize_t size, int device, void *stream) {
  (void)device;
  if (!ptr) return;
  int64_t started = now_ns();
  pthread_mutex_lock(&lock);
  char *p = (char *)ptr;
  if (pool_base && p >= pool_base && p < pool_base + pool_bytes) {
    int64_t freed = live_remove(p - pool_base);
    if (freed > 0) note_live(-freed, 0);
  } else {
    heap_free(ptr, stream);
    note_live(-(int64_t)size, 1);
  }
  stats.free_ns += now_ns() - started;
  pthread_mutex_unlock(&lock);
}

/* Count (and, while verifying, log) the slots the iteration that ends now never requested. */
static void close_iteration(void) {
  if (!armed) return;
  for (int64_t k = 0; k < n_slots; k++) {
    if (served_in[k] == generation) continue;
    stats.missed_slots++;
    log_miss(-1, 0, slot_op[k], k, MISS_NEVER_REQUESTED);
  }
}

/* Reserve the pool and load the plan (slots sorted by op, ops below `ops`), replacing the
 * previous pool. Returns 0 on success, 1 when the block could not be reserved, 2 while a block
 * of the old pool is live, 3 for slots out of op order. */
int memplan_configure(int64_t bytes, int64_t n, const int64_t *sizes, const int64_t *offsets, const int64_t *ops,
                      int64_t n_op) {
  for (int64_t j = 0; j < n; j++)
    if (ops[j] < 0 || ops[j] >= n_op || (j && ops[j] < ops[j - 1])) return 3;
  pthread_mutex_lock(&lock);
  if (n_live > 0) { pthread_mutex_unlock(&lock); return 2; }  /* a block of the old pool is still in use */
  int rc = 0;
  if (pool_base) block_free(pool_base);
  pool_base = NULL;
  free(slot_size); free(slot_offset); free(slot_op); free(served_in); free(live); free(op_first);
  size_t cells = (size_t)(n ? n : 1);
  slot_size = malloc(sizeof(int64_t) * cells);
  slot_offset = malloc(sizeof(int64_t) * cells);
  slot_op = malloc(sizeof(int64_t) * cells);
  served_in = calloc(cells, sizeof(int64_t));
  live = malloc(sizeof(range_t) * cells);
  op_first = malloc(sizeof(int64_t) * (size_t)(n_op + 1));
  memcpy(slot_size, sizes, sizeof(int64_t) * (size_t)n);
  memcpy(slot_offset, offsets, sizeof(int64_t) * (size_t)n);
  memcpy(slot_op, ops, sizeof(int64_t) * (size_t)n);
  for (int64_t op = 0, j = 0; op <= n_op; op++) {
    while (j < n && ops[j] < op) j++;
    op_first[op] = j;
  }
  n_slots = n; n_ops = n_op; pool_bytes = bytes; n_live = 0;
  min_slot = INT64_MAX;
  for (int64_t j = 0; j < n; j++) if (sizes[j] < min_slot) min_slot = sizes[j];
  generation = request_no = n_misses = 0;
  armed = verifying = 0;
  int64_t live_now = stats.live_bytes, heap_now = stats.heap_live_bytes;  /* the heap's blocks outlive a plan */
  memset(&stats, 0, sizeof(stats));
  stats.live_bytes = stats.peak_live_bytes = live_now;
  stats.heap_live_bytes = stats.peak_heap_live_bytes = heap_now;
  if (bytes > 0 && block_alloc((void **)&pool_base, (size_t)bytes) != 0) { pool_base = NULL; pool_bytes = 0; rc = 1; }
  pthread_mutex_unlock(&lock);
  return rc;
}

/* Start an iteration and arm: requests on `stream` are matched to the plan's slots. The first
 * iteration after memplan_configure is the verified one: its mismatches are logged. */
void memplan_begin_iteration(void *stream) {
  pthread_mutex_lock(&lock);
  close_iteration();
  verifying = generation == 0;
  generation++;
  request_no = 0;
  home_stream = stream;
  armed = 1;
  stats.iterations++;
  pthread_mutex_unlock(&lock);
}

/* End the iteration and disarm: requests go to the heap until the next one begins. */
void memplan_end_iteration(void) {
  pthread_mutex_lock(&lock);
  close_iteration();
  verifying = 0;
  armed = 0;
  pthread_mutex_unlock(&lock);
}

void memplan_reset_peaks(void) {
  pthread_mutex_lock(&lock);
  stats.peak_live_bytes = stats.live_bytes;
  stats.peak_heap_live_bytes = stats.heap_live_bytes;
  heap_reset_peak();
  pthread_mutex_unlock(&lock);
}

void memplan_get_stats(memplan_stats *out) {
  pthread_mutex_lock(&lock);
  *out = stats;
  pthread_mutex_unlock(&lock);
}

/* Copy up to `cap` logged mismatches of the verified iteration; returns how many. */
int64_t memplan_get_misses(memplan_miss *out, int64_t cap) {
  pthread_mutex_lock(&lock);
  int64_t n = n_misses < cap ? n_misses : cap;
  memcpy(out, misses, sizeof(memplan_miss) * (size_t)n);
  pthread_mutex_unlock(&lock);
  return n;
}

uintptr_t memplan_pool_base(void) { return (uintptr_t)pool_base; }
