/* The inner loops of the offline pool allocators, built once per machine (native.py).
 *
 * Why C and not numba: a fresh process must lay out a small problem in under a second, and
 * importing numba and starting its compiler costs about that much before any work (measured on
 * the project's CPU host); a C library loads in a millisecond.
 *
 * 1. mp_conflict_graph: pairs of buffers whose lifetimes overlap, as CSR.
 * 2. mp_greedy: paper 000's greedy (best-fit or first-fit gap, buffers in a given order).
 * 3. mp_search_*: the exact canonical search of minimalloc (Moffitt, ASPLOS'23), iterative
 *    and resumable. The contract and its rules are in search.py's docstring; the numbers
 *    below (rule N) refer to it.
 *
 * Everything is int64 but the conflict graph's neighbour lists (int32, half the memory); arrays come from numpy and stay owned by the caller, except the search
 * state, which mp_search_new allocates and mp_search_free releases.
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NO_OFFSET (-1)
#define BIG INT64_MAX

/* ---- 1. conflict graph ------------------------------------------------------------------ */

/* Sweep in start order keeping the buffers still alive; with indices == NULL only count.
 * deg must be zeroed; fill (n entries) is the next free slot per buffer when filling. */
static void sweep_pairs(int64_t n, const int64_t *starts, const int64_t *ends, const int64_t *order,
                        int64_t *deg, int64_t *fill, int32_t *indices, int64_t *active) {
    int64_t na = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t i = order[k], m = 0;
        for (int64_t a = 0; a < na; a++) {
            int64_t j = active[a];
            if (ends[j] <= starts[i]) continue;
            active[m++] = j;
            if (indices) {
                indices[fill[i]++] = (int32_t)j;
                indices[fill[j]++] = (int32_t)i;
            } else {
                deg[i]++;
                deg[j]++;
            }
        }
        na = m;
        active[na++] = i;
    }
}

/* indptr (n+1) gets the CSR offsets; returns the number of entries (2 x pairs). */
int64_t mp_conflict_count(int64_t n, const int64_t *starts, const int64_t *ends, const int64_t *order,
                          int64_t *indptr) {
    int64_t *deg = calloc(n + 1, sizeof(int64_t)), *active = malloc((n + 1) * sizeof(int64_t));
    sweep_pairs(n, starts, ends, order, deg, NULL, NULL, active);
    indptr[0] = 0;
    for (int64_t i = 0; i < n; i++) indptr[i + 1] = indptr[i] + deg[i];
    free(deg);
    free(active);
    return indptr[n];
}

void mp_conflict_fill(int64_t n, const int64_t *starts, const int64_t *ends, const int64_t *order,
                      const int64_t *indptr, int32_t *indices) {
    int64_t *fill = malloc((n + 1) * sizeof(int64_t)), *active = malloc((n + 1) * sizeof(int64_t));
    memcpy(fill, indptr, n * sizeof(int64_t));
    sweep_pairs(n, starts, ends, order, NULL, fill, indices, active);
    free(fill);
    free(active);
}

/* ---- 2. greedy ------------------------------------------------------------------------- */

typedef struct { int64_t lo, hi; } span_t;

/* Sort spans by lo (quicksort, insertion sort below 16: qsort's callback costs a third of
 * the greedy's time). */
static void sort_spans(span_t *a, int64_t m) {
    while (m > 16) {
        int64_t x = a[m / 2].lo, i = 0, j = m - 1;
        while (i <= j) {
            while (a[i].lo < x) i++;
            while (a[j].lo > x) j--;
            if (i <= j) {
                span_t t = a[i];
                a[i++] = a[j];
                a[j--] = t;
            }
        }
        if (j + 1 < m - i) { /* recurse into the smaller side, loop on the larger */
            sort_spans(a, j + 1);
            a += i;
            m -= i;
        } else {
            sort_spans(a + i, m - i);
            m = j + 1;
        }
    }
    for (int64_t i = 1; i < m; i++) {
        span_t v = a[i];
        int64_t j = i;
        for (; j > 0 && a[j - 1].lo > v.lo; j--) a[j] = a[j - 1];
        a[j] = v;
    }
}

/* Place buffers in `order`, each in the best (smallest) or first (lowest) gap its placed
 * time-neighbours leave, the space between their highest top and the pool top counting as a gap;
 * off gets the offsets; returns the footprint. */
int64_t mp_greedy(int64_t n, const int64_t *order, const int64_t *sizes, const int64_t *indptr,
                  const int32_t *indices, int best_fit, int64_t *off) {
    int64_t max_deg = 0, footprint = 0;
    for (int64_t i = 0; i < n; i++) {
        off[i] = NO_OFFSET;
        if (indptr[i + 1] - indptr[i] > max_deg) max_deg = indptr[i + 1] - indptr[i];
    }
    span_t *placed = malloc((max_deg + 1) * sizeof(span_t));
    for (int64_t k = 0; k < n; k++) {
        int64_t i = order[k], m = 0, size = sizes[i];
        for (int64_t p = indptr[i]; p < indptr[i + 1]; p++) {
            int64_t j = indices[p];
            if (off[j] != NO_OFFSET) placed[m++] = (span_t){off[j], off[j] + sizes[j]};
        }
        sort_spans(placed, m);
        int64_t chosen = NO_OFFSET, chosen_gap = 0, cur = 0;
        for (int64_t t = 0; t < m; t++) {
            int64_t gap = placed[t].lo - cur;
            if (gap >= size && (chosen == NO_OFFSET || gap < chosen_gap)) {
                chosen = cur;
                chosen_gap = gap;
                if (!best_fit) break;
            }
            if (placed[t].hi > cur) cur = placed[t].hi;
        }
        int64_t top_gap = footprint - cur;
        if (chosen == NO_OFFSET || (best_fit && size <= top_gap && top_gap < chosen_gap)) chosen = cur;
        off[i] = chosen;
        if (chosen + size > footprint) footprint = chosen + size;
    }
    free(placed);
    return footprint;
}

/* ---- 3. exact search ------------------------------------------------------------------- */

enum { FOUND = 1, NOT_FOUND = 0, RUNNING = -1 };
enum { K_MIN_OFF, K_FLOOR, K_TOTAL, K_CUT, K_RANK };   /* undo-log record kinds */
enum { SEARCH, SPLIT };                               /* frame kinds */
enum { E_ENTER, E_CHILD_FOUND, E_CHILD_FAILED };      /* what happened to the top frame */

/* The static problem, filled in by search.py (every pointer has n or sections+1 entries as
 * named; keys is nkeys rows of n: the preorder, smaller first, row t_row recomputed per part). */
typedef struct {
    int64_t n, sections, nkeys, t_row;
    const int64_t *sizes, *indptr, *sec_lo, *sec_hi, *sec_ptr, *sec_members, *by_lo, *lo_ptr;
    const int64_t *twin, *keys, *section_total, *cuts;
    const int32_t *indices;
} mp_problem;

/* A SEARCH frame is one node over sections [slo, shi) whose canonical bound is (last_off,
 * last_rank); prev_key is the key of the candidate being tried, mark/pmark the log and placed
 * positions to roll back to. A SPLIT frame solves the parts of [slo, shi) one by one from next. */
typedef struct {
    int64_t kind, slo, shi, last_off, last_rank, min_height, limit, prev_key, mark, pmark, hatless, next;
} frame_t;

typedef struct { int64_t kind, idx, val; } undo_t;

typedef struct {
    const mp_problem *p;
    int64_t cap, nodes, event, depth, nplaced, tag, logp, log_cap;
    int64_t *off, *min_off, *floor, *total, *cuts, *rank, *placed, *stamp, *ids, *tmp;
    frame_t *frames;
    undo_t *log;
} mp_search;

static void push(mp_search *s, int64_t kind, int64_t idx, int64_t val) {
    if (s->logp == s->log_cap) {
        s->log_cap *= 2;
        s->log = realloc(s->log, s->log_cap * sizeof(undo_t));
    }
    s->log[s->logp++] = (undo_t){kind, idx, val};
}

/* Roll the log back to `mark` and unplace the buffers placed after `pmark`. */
static void undo(mp_search *s, int64_t mark, int64_t pmark) {
    while (s->logp > mark) {
        undo_t u = s->log[--s->logp];
        int64_t *target = u.kind == K_MIN_OFF ? s->min_off : u.kind == K_FLOOR ? s->floor
                        : u.kind == K_TOTAL ? s->total : u.kind == K_CUT ? s->cuts : s->rank;
        target[u.idx] = u.val;
    }
    while (s->nplaced > pmark) s->off[s->placed[--s->nplaced]] = NO_OFFSET;
}

/* Rule 2: a section's floor is at least the lowest offset any of its unplaced buffers can take. */
static void raise_floor(mp_search *s, int64_t sec) {
    const mp_problem *p = s->p;
    int64_t low = BIG;
    for (int64_t q = p->sec_ptr[sec]; q < p->sec_ptr[sec + 1]; q++) {
        int64_t b = p->sec_members[q];
        if (s->off[b] == NO_OFFSET && s->min_off[b] < low) low = s->min_off[b];
    }
    if (low != BIG && s->floor[sec] < low) {
        push(s, K_FLOOR, sec, s->floor[sec]);
        s->floor[sec] = low;
    }
}

/* Place c at min_off[c]. Sets *splits when it leaves a boundary no unplaced buffer crosses and
 * *hatless when it constrains no unplaced buffer. */
static void place(mp_search *s, int64_t c, int *splits, int *hatless) {
    const mp_problem *p = s->p;
    int64_t h = s->min_off[c] + p->sizes[c];
    s->off[c] = s->min_off[c];
    s->placed[s->nplaced++] = c;
    for (int64_t sec = p->sec_lo[c]; sec < p->sec_hi[c]; sec++) {
        push(s, K_FLOOR, sec, s->floor[sec]);
        push(s, K_TOTAL, sec, s->total[sec]);
        s->floor[sec] = h;
        s->total[sec] -= p->sizes[c];
    }
    *hatless = 1;
    for (int64_t q = p->indptr[c]; q < p->indptr[c + 1]; q++) {
        int64_t nb = p->indices[q];
        if (s->off[nb] != NO_OFFSET) continue;
        *hatless = 0;
        if (s->min_off[nb] < h) {
            push(s, K_MIN_OFF, nb, s->min_off[nb]);
            s->min_off[nb] = h;
        }
    }
    /* Floors only after every neighbour's lowest offset moved, so each section is visited once. */
    int64_t tag = ++s->tag;
    for (int64_t q = p->indptr[c]; q < p->indptr[c + 1]; q++) {
        int64_t nb = p->indices[q];
        if (s->off[nb] != NO_OFFSET || s->min_off[nb] != h) continue;
        for (int64_t sec = p->sec_lo[nb]; sec < p->sec_hi[nb]; sec++) {
            if (s->stamp[sec] == tag) continue;
            s->stamp[sec] = tag;
            raise_floor(s, sec);
        }
    }
    *splits = 0;
    for (int64_t b = p->sec_lo[c]; b < p->sec_hi[c] - 1; b++) {
        push(s, K_CUT, b, s->cuts[b]);
        if (--s->cuts[b] == 0) *splits = 1;
    }
}

/* Rule 5: the highest offset at which the next buffer passes the section check, -1 if none.
 * Placing c at o (its lowest offset, so no floor in its lifetime exceeds o) makes every section
 * need max(o, floor) + total <= cap, c's own included (its top replaces the floor and its size
 * leaves the total): a condition on o alone, computed once per node. */
static int64_t offset_limit(const mp_search *s, int64_t slo, int64_t shi) {
    int64_t limit = s->cap;
    for (int64_t sec = slo; sec < shi; sec++) {
        if (s->floor[sec] + s->total[sec] > s->cap) return -1;
        if (s->cap - s->total[sec] < limit) limit = s->cap - s->total[sec];
    }
    return limit;
}

static int sections_fit(const mp_search *s, int64_t offset, int64_t slo, int64_t shi) {
    for (int64_t sec = slo; sec < shi; sec++) {
        int64_t f = s->floor[sec] > offset ? s->floor[sec] : offset;
        if (f + s->total[sec] > s->cap) return 0;
    }
    return 1;
}

/* Rule 1: the lowest top any unplaced buffer of [slo, shi) can reach (BIG when none is left). */
static int64_t min_height(const mp_search *s, int64_t slo, int64_t shi) {
    const mp_problem *p = s->p;
    int64_t low = BIG;
    for (int64_t q = p->lo_ptr[slo]; q < p->lo_ptr[shi]; q++) {
        int64_t i = p->by_lo[q];
        if (s->off[i] == NO_OFFSET && p->sec_hi[i] <= shi && s->min_off[i] + p->sizes[i] < low)
            low = s->min_off[i] + p->sizes[i];
    }
    return low;
}

/* The eligible unplaced buffer of frame f with the smallest key above f->prev_key, -1 if none. */
static int64_t next_candidate(const mp_search *s, frame_t *f) {
    const mp_problem *p = s->p;
    int64_t best = -1, best_key = BIG;
    for (int64_t q = p->lo_ptr[f->slo]; q < p->lo_ptr[f->shi]; q++) {
        int64_t i = p->by_lo[q];
        if (s->off[i] != NO_OFFSET || p->sec_hi[i] > f->shi) continue;
        int64_t o = s->min_off[i], key = o * p->n + s->rank[i];
        if (key <= f->prev_key || key >= best_key || o >= f->min_height || o > f->limit) continue;
        if (o < f->last_off || (o == f->last_off && s->rank[i] < f->last_rank)) continue; /* not canonical */
        if (p->twin[i] >= 0 && s->off[p->twin[i]] == NO_OFFSET) continue;                  /* rule 6 */
        best = i;
        best_key = key;
    }
    if (best >= 0) f->prev_key = best_key;
    return best;
}

static void push_frame(mp_search *s, int64_t kind, int64_t slo, int64_t shi, int64_t last_off, int64_t last_rank) {
    frame_t *f = &s->frames[s->depth++];
    f->kind = kind;
    f->slo = slo;
    f->shi = shi;
    f->last_off = last_off;
    f->last_rank = last_rank;
    f->next = slo;
    s->event = E_ENTER;
}

static void pop(mp_search *s, int64_t event) {
    s->depth--;
    s->event = event;
}

/* Lexicographic order of two buffers by the preorder rows (row t_row from s->tmp), then index. */
static int preorder_less(const mp_search *s, int64_t a, int64_t b) {
    const mp_problem *p = s->p;
    for (int64_t r = 0; r < p->nkeys; r++) {
        int64_t x = r == p->t_row ? s->tmp[a] : p->keys[r * p->n + a];
        int64_t y = r == p->t_row ? s->tmp[b] : p->keys[r * p->n + b];
        if (x != y) return x < y;
    }
    return a < b;
}

/* Insertion sort for short runs, merge sort above (stable, no allocation beyond `buf`). */
static void sort_ids(const mp_search *s, int64_t *ids, int64_t *buf, int64_t m) {
    if (m < 16) {
        for (int64_t i = 1; i < m; i++) {
            int64_t v = ids[i], j = i;
            for (; j > 0 && preorder_less(s, v, ids[j - 1]); j--) ids[j] = ids[j - 1];
            ids[j] = v;
        }
        return;
    }
    int64_t h = m / 2, i = 0, j = h, k = 0;
    sort_ids(s, ids, buf, h);
    sort_ids(s, ids + h, buf, m - h);
    while (i < h && j < m) buf[k++] = preorder_less(s, ids[j], ids[i]) ? ids[j++] : ids[i++];
    while (i < h) buf[k++] = ids[i++];
    while (j < m) buf[k++] = ids[j++];
    memcpy(ids, buf, m * sizeof(int64_t));
}

/* Rank the unplaced buffers of sections [slo, shi) by the preorder, with T (the largest section
 * total in a buffer's lifetime) taken from the sizes still unplaced: minimalloc ranks each
 * partition afresh this way. */
static void rank_part(mp_search *s, int64_t slo, int64_t shi) {
    const mp_problem *p = s->p;
    int64_t m = 0;
    for (int64_t q = p->lo_ptr[slo]; q < p->lo_ptr[shi]; q++) {
        int64_t i = p->by_lo[q];
        if (s->off[i] != NO_OFFSET || p->sec_hi[i] > shi) continue;
        s->ids[m++] = i;
        if (p->t_row < 0) continue;
        int64_t t = 0;
        for (int64_t sec = p->sec_lo[i]; sec < p->sec_hi[i]; sec++)
            if (s->total[sec] > t) t = s->total[sec];
        s->tmp[i] = -t; /* larger first */
    }
    sort_ids(s, s->ids, s->placed + s->nplaced, m); /* the unused tail of `placed` is scratch */
    for (int64_t k = 0; k < m; k++) {
        push(s, K_RANK, s->ids[k], s->rank[s->ids[k]]);
        s->rank[s->ids[k]] = k;
    }
}

/* Push a SEARCH frame for the next part of SPLIT frame f; 0 when no part is left. */
static int next_part(mp_search *s, frame_t *f) {
    int64_t lo = f->next, shi = f->shi, b = lo;
    if (lo >= shi) return 0;
    while (b < shi - 1 && s->cuts[b] != 0) b++;
    f->next = b + 1;
    rank_part(s, lo, b + 1);
    push_frame(s, SEARCH, lo, b + 1, -1, -1);
    return 1;
}

/* Place the next candidate of SEARCH frame f that passes the checks and push its child frame;
 * pop f as failed when none is left. */
static void try_candidates(mp_search *s, frame_t *f) {
    for (;;) {
        int64_t c = next_candidate(s, f);
        if (c < 0) {
            pop(s, E_CHILD_FAILED);
            return;
        }
        int64_t o = s->min_off[c];
        int splits, hatless;
        f->mark = s->logp;
        f->pmark = s->nplaced;
        place(s, c, &splits, &hatless);
        f->hatless = hatless;
        if (sections_fit(s, o, f->slo, f->shi)) {
            if (splits) push_frame(s, SPLIT, f->slo, f->shi, -1, -1); /* rule 4 */
            else push_frame(s, SEARCH, f->slo, f->shi, o, s->rank[c]);
            return;
        }
        undo(s, f->mark, f->pmark);
        if (hatless) {
            pop(s, E_CHILD_FAILED); /* rule 3 */
            return;
        }
    }
}

/* First visit of a node: done when its part is empty, else set its bounds and try candidates. */
static void enter_search(mp_search *s, frame_t *f) {
    f->min_height = min_height(s, f->slo, f->shi);
    if (f->min_height == BIG) {
        pop(s, E_CHILD_FOUND);
        return;
    }
    f->limit = offset_limit(s, f->slo, f->shi);
    f->prev_key = -1;
    try_candidates(s, f);
}

/* A fresh search of problem p at capacity cap (p and its arrays must outlive it). */
mp_search *mp_search_new(const mp_problem *p, int64_t cap) {
    mp_search *s = calloc(1, sizeof(mp_search));
    int64_t n = p->n, S = p->sections;
    s->p = p;
    s->cap = cap;
    int64_t **arrays[] = {&s->off, &s->min_off, &s->rank, &s->placed, &s->ids, &s->tmp};
    for (size_t k = 0; k < sizeof(arrays) / sizeof(arrays[0]); k++) *arrays[k] = calloc(n + 1, sizeof(int64_t));
    int64_t **per_section[] = {&s->floor, &s->total, &s->cuts, &s->stamp};
    for (size_t k = 0; k < sizeof(per_section) / sizeof(per_section[0]); k++) *per_section[k] = calloc(S + 1, sizeof(int64_t));
    s->frames = calloc(2 * n + 2, sizeof(frame_t));
    s->log_cap = 4 * (n + S) + 16;
    s->log = malloc(s->log_cap * sizeof(undo_t));
    memcpy(s->total, p->section_total, S * sizeof(int64_t));
    if (S > 1) memcpy(s->cuts, p->cuts, (S - 1) * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++) s->off[i] = NO_OFFSET;
    push_frame(s, SPLIT, 0, S, -1, -1); /* the root: solve every independent part */
    return s;
}

void mp_search_free(mp_search *s) {
    int64_t *arrays[] = {s->off, s->min_off, s->rank, s->placed, s->ids, s->tmp, s->floor, s->total, s->cuts, s->stamp};
    for (size_t k = 0; k < sizeof(arrays) / sizeof(arrays[0]); k++) free(arrays[k]);
    free(s->frames);
    free(s->log);
    free(s);
}

int64_t mp_search_nodes(const mp_search *s) { return s->nodes; }

void mp_search_offsets(const mp_search *s, int64_t *out) { memcpy(out, s->off, s->p->n * sizeof(int64_t)); }

/* Continue the search for at most `budget` more nodes: FOUND, NOT_FOUND, or RUNNING (budget
 * spent, or *stop < index: another search of the round concluded first; call again to go on). */
int mp_search_advance(mp_search *s, int64_t budget, const int64_t *stop, int64_t index) {
    int64_t end = s->nodes + budget;
    for (;;) {
        if (s->depth == 0) return s->event == E_CHILD_FOUND ? FOUND : NOT_FOUND;
        frame_t *f = &s->frames[s->depth - 1];
        if (f->kind == SPLIT) {
            if (s->event == E_CHILD_FAILED) pop(s, E_CHILD_FAILED);
            else if (!next_part(s, f)) pop(s, E_CHILD_FOUND); /* every part solved */
        } else if (s->event == E_ENTER) {
            if (s->nodes >= end || __atomic_load_n(stop, __ATOMIC_RELAXED) < index) return RUNNING;
            s->nodes++;
            enter_search(s, f);
        } else if (s->event == E_CHILD_FOUND) {
            pop(s, E_CHILD_FOUND); /* the child solved the rest of this frame's part */
        } else {
            undo(s, f->mark, f->pmark);
            if (f->hatless) pop(s, E_CHILD_FAILED); /* rule 3 */
            else try_candidates(s, f);
        }
    }
}

/* ---- 4. skyline dive ------------------------------------------------------------------- */

/* The search's first path without its checks, in O(n log n) and no conflict graph (for large
 * problems): repeatedly place the unplaced buffer with the lowest offset its placed
 * time-neighbours leave free (ties by rank) there. The skyline (highest top per section) is a
 * segment tree; a heap holds each buffer's last known lowest offset, which only grows, so a
 * popped entry is re-checked and pushed back when it went stale. */

typedef struct { int64_t key, i; } entry_t;

static void heap_push(entry_t *heap, int64_t *len, entry_t e) {
    int64_t k = (*len)++;
    while (k > 0 && heap[(k - 1) / 2].key > e.key) {
        heap[k] = heap[(k - 1) / 2];
        k = (k - 1) / 2;
    }
    heap[k] = e;
}

static entry_t heap_pop(entry_t *heap, int64_t *len) {
    entry_t top = heap[0], last = heap[--(*len)];
    int64_t k = 0;
    for (;;) {
        int64_t c = 2 * k + 1;
        if (c >= *len) break;
        if (c + 1 < *len && heap[c + 1].key < heap[c].key) c++;
        if (heap[c].key >= last.key) break;
        heap[k] = heap[c];
        k = c;
    }
    heap[k] = last;
    return top;
}

/* Max-tree with range assignment: mx[node] is the max over its range, lz[node] a pending
 * assignment (-1 none). Nodes 1.., children 2k and 2k+1, ranges [l, r). */
static void tree_assign(int64_t *mx, int64_t *lz, int64_t node, int64_t l, int64_t r, int64_t ql, int64_t qr, int64_t h) {
    if (qr <= l || r <= ql) return;
    if (ql <= l && r <= qr) {
        mx[node] = lz[node] = h;
        return;
    }
    int64_t mid = (l + r) / 2;
    if (lz[node] >= 0) {
        mx[2 * node] = lz[2 * node] = mx[2 * node + 1] = lz[2 * node + 1] = lz[node];
        lz[node] = -1;
    }
    tree_assign(mx, lz, 2 * node, l, mid, ql, qr, h);
    tree_assign(mx, lz, 2 * node + 1, mid, r, ql, qr, h);
    mx[node] = mx[2 * node] > mx[2 * node + 1] ? mx[2 * node] : mx[2 * node + 1];
}

static int64_t tree_max(const int64_t *mx, const int64_t *lz, int64_t node, int64_t l, int64_t r, int64_t ql, int64_t qr) {
    if (qr <= l || r <= ql) return 0;
    if ((ql <= l && r <= qr) || lz[node] >= 0) return mx[node];
    int64_t mid = (l + r) / 2, a = tree_max(mx, lz, 2 * node, l, mid, ql, qr), b = tree_max(mx, lz, 2 * node + 1, mid, r, ql, qr);
    return a > b ? a : b;
}

/* Offsets into off; returns the footprint, or -1 after max_pops heap pops (dense problems pop
 * long-lived buffers again and again). rank is a permutation of 0..n-1. */
int64_t mp_dive(int64_t n, int64_t sections, const int64_t *sizes, const int64_t *sec_lo, const int64_t *sec_hi,
                const int64_t *rank, int64_t max_pops, int64_t *off) {
    int64_t *mx = calloc(4 * sections + 4, sizeof(int64_t)), *lz = malloc((4 * sections + 4) * sizeof(int64_t));
    entry_t *heap = malloc((n + 1) * sizeof(entry_t));
    int64_t len = 0, footprint = 0;
    for (int64_t k = 0; k < 4 * sections + 4; k++) lz[k] = -1;
    for (int64_t i = 0; i < n; i++) heap_push(heap, &len, (entry_t){rank[i], i});
    while (len > 0 && max_pops-- > 0) {
        entry_t e = heap_pop(heap, &len);
        int64_t i = e.i, low = tree_max(mx, lz, 1, 0, sections, sec_lo[i], sec_hi[i]), key = low * n + rank[i];
        if (key > e.key) {
            heap_push(heap, &len, (entry_t){key, i});
            continue;
        }
        off[i] = low;
        tree_assign(mx, lz, 1, 0, sections, sec_lo[i], sec_hi[i], low + sizes[i]);
        if (low + sizes[i] > footprint) footprint = low + sizes[i];
    }
    free(mx);
    free(lz);
    free(heap);
    return len > 0 ? -1 : footprint;
}

/* ---- 5. allocation-order fit ----------------------------------------------------------- */

/* The greedy in allocation order without a conflict graph (for large problems): buffers in
 * `order` (sorted by start), those ending at or before a start freed first (`by_end`: indices
 * sorted by end); free address blocks below the pool top kept sorted by address and merged on
 * free; each buffer takes the best (smallest) or first (lowest) block that fits, else the block
 * reaching the top (grown) or the top. O(n x free blocks). Returns the footprint. */
typedef struct { int64_t addr, size; } block_t;

static void free_block(block_t *blocks, int64_t *nb, int64_t addr, int64_t size) {
    int64_t lo = 0, hi = *nb;
    while (lo < hi) { /* first block above addr */
        int64_t mid = (lo + hi) / 2;
        if (blocks[mid].addr < addr) lo = mid + 1;
        else hi = mid;
    }
    int merge_left = lo > 0 && blocks[lo - 1].addr + blocks[lo - 1].size == addr;
    int merge_right = lo < *nb && addr + size == blocks[lo].addr;
    if (merge_left && merge_right) {
        blocks[lo - 1].size += size + blocks[lo].size;
        memmove(blocks + lo, blocks + lo + 1, (*nb - lo - 1) * sizeof(block_t));
        (*nb)--;
    } else if (merge_left) {
        blocks[lo - 1].size += size;
    } else if (merge_right) {
        blocks[lo].addr = addr;
        blocks[lo].size += size;
    } else {
        memmove(blocks + lo + 1, blocks + lo, (*nb - lo) * sizeof(block_t));
        blocks[lo] = (block_t){addr, size};
        (*nb)++;
    }
}

int64_t mp_sweep_fit(int64_t n, const int64_t *starts, const int64_t *ends, const int64_t *sizes, const int64_t *order,
                     const int64_t *by_end, int best_fit, int64_t *off) {
    block_t *blocks = malloc((n + 1) * sizeof(block_t));
    int64_t nb = 0, top = 0, next_end = 0;
    for (int64_t i = 0; i < n; i++) off[i] = NO_OFFSET;
    for (int64_t k = 0; k < n; k++) {
        int64_t i = order[k], size = sizes[i], pick = -1;
        for (; next_end < n && ends[by_end[next_end]] <= starts[i]; next_end++) {
            int64_t j = by_end[next_end];
            if (off[j] != NO_OFFSET) free_block(blocks, &nb, off[j], sizes[j]);
        }
        for (int64_t b = 0; b < nb; b++) {
            if (blocks[b].size < size || (pick >= 0 && blocks[b].size >= blocks[pick].size)) continue;
            pick = b;
            if (!best_fit) break;
        }
        if (pick >= 0) {
            off[i] = blocks[pick].addr;
            blocks[pick].addr += size;
            blocks[pick].size -= size;
            if (blocks[pick].size == 0) memmove(blocks + pick, blocks + pick + 1, (--nb - pick) * sizeof(block_t));
        } else if (nb > 0 && blocks[nb - 1].addr + blocks[nb - 1].size == top) {
            off[i] = blocks[--nb].addr; /* the block reaching the top grows the pool */
            top = off[i] + size;
        } else {
            off[i] = top;
            top += size;
        }
    }
    free(blocks);
    return top;
}
