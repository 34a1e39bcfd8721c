/* The kernels' thread pool (pool.h says why it is not OpenMP).
 *
 * One job at a time. The job's claim counter and its generation share one 64-bit word, gen << 32 | next item,
 * so a claim (compare-and-swap) succeeds only for the job it was read for: a worker that read an old job's
 * fields and slept through its end fails its claim and looks again. Job fields are written only once every item
 * of the previous job is claimed and done, after that job's word is closed (next = all ones: no claim of it can
 * succeed, whatever fields a late worker reads) and before the new word is published. */
#define _GNU_SOURCE
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#define POOL_MAX 256       /* threads, the caller included */
#define SPIN_NS 200000     /* a worker's spin after a job (ns): a pass's next kernel call comes within tens of us */
#define YIELD_NS 50000     /* the caller's wait for a claimed chunk (ns) before it starts yielding its core */
#define MAX_ITEMS 0x7fffffffLL

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define POOL_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define POOL_PAUSE() __asm__ __volatile__("yield")
#else
#define POOL_PAUSE() ((void)0)
#endif

typedef struct {
    _Atomic(cuca_item_fn) fn;
    _Atomic(void *) ctx;
    atomic_llong n_items, chunk;
    atomic_int nt;
    atomic_ullong word;   /* gen << 32 | next unclaimed item */
    atomic_llong done;    /* items of the current job finished by workers */
    atomic_int sleepers;  /* workers waiting on cv */
    pthread_mutex_t mu;   /* guards the sleep on cv */
    pthread_cond_t cv;
    pthread_mutex_t run;  /* held by the one caller whose job runs */
    uint32_t gen;         /* the last job's generation (under run) */
    int n_workers;        /* started (under run) */
} pool_t;

static pool_t P = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
                   .run = PTHREAD_MUTEX_INITIALIZER};
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

/* Test only (cuca_pool_test_delays): delays in ns, 0 = off, read with one relaxed load where they sit; the times
 * a delayed worker read a job's fields inside the window the close guards. */
static atomic_llong test_wait_ns, test_publish_ns, test_windows;

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static uint32_t word_gen(uint64_t w) { return (uint32_t)(w >> 32); }

static int test_sleep(atomic_llong *ns) {
    const int64_t t = atomic_load_explicit(ns, memory_order_relaxed);
    if (t > 0) nanosleep(&(struct timespec){.tv_sec = t / 1000000000LL, .tv_nsec = t % 1000000000LL}, NULL);
    return t > 0;
}

int64_t cuca_pool_test_delays(int64_t wait_ns, int64_t publish_ns) {
    atomic_store(&test_wait_ns, wait_ns);
    atomic_store(&test_publish_ns, publish_ns);
    return atomic_exchange(&test_windows, 0);
}

/* Claim the next chunk of job `gen`: [*lo, *hi). 0 when the job has no items left or is no longer current. */
static int pool_claim(uint32_t gen, int64_t n, int64_t chunk, int64_t *lo, int64_t *hi) {
    uint64_t w = atomic_load_explicit(&P.word, memory_order_acquire);
    for (;;) {
        const int64_t next = (int64_t)(uint32_t)w;
        if (word_gen(w) != gen || next >= n) return 0;
        const int64_t end = next + chunk < n ? next + chunk : n;
        if (atomic_compare_exchange_weak_explicit(&P.word, &w, ((uint64_t)gen << 32) | (uint64_t)end,
                                                  memory_order_acq_rel, memory_order_acquire)) {
            *lo = next;
            *hi = end;
            return 1;
        }
    }
}

/* Wait until a job newer than `seen` is published; spin SPIN_NS, then sleep. Returns its generation. */
static uint32_t pool_wait(uint32_t seen) {
    const int64_t t0 = now_ns();
    for (unsigned k = 1;; k++) {
        const uint64_t w = atomic_load_explicit(&P.word, memory_order_acquire);
        if (word_gen(w) != seen) return word_gen(w);
        POOL_PAUSE();
        if ((k & 255) == 0 && now_ns() - t0 > SPIN_NS) break;
    }
    pthread_mutex_lock(&P.mu);
    atomic_fetch_add(&P.sleepers, 1); /* seq_cst, against the caller's publish-then-look (pool_run) */
    uint64_t w;
    while (word_gen(w = atomic_load(&P.word)) == seen) pthread_cond_wait(&P.cv, &P.mu);
    atomic_fetch_sub(&P.sleepers, 1);
    pthread_mutex_unlock(&P.mu);
    return word_gen(w);
}

static void *pool_worker(void *arg) {
    const int tid = (int)(intptr_t)arg;
    uint32_t seen = word_gen(atomic_load(&P.word));
    for (;;) {
        const uint32_t gen = pool_wait(seen);
        seen = gen;
        const int testing = test_sleep(&test_wait_ns); /* a worker descheduled between seeing a job and its fields */
        /* possibly a newer job's fields: then the claims below fail, and the loop looks again */
        const cuca_item_fn fn = atomic_load_explicit(&P.fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&P.ctx, memory_order_relaxed);
        const int64_t n = atomic_load_explicit(&P.n_items, memory_order_relaxed);
        const int64_t chunk = atomic_load_explicit(&P.chunk, memory_order_relaxed);
        if (testing && atomic_load(&P.word) == (((uint64_t)gen << 32) | 0xFFFFFFFFull))
            atomic_fetch_add(&test_windows, 1); /* its job closed, the next one not yet published */
        if (tid >= atomic_load_explicit(&P.nt, memory_order_relaxed)) continue;
        int64_t lo, hi;
        while (pool_claim(gen, n, chunk, &lo, &hi)) {
            for (int64_t i = lo; i < hi; i++) fn(ctx, i, tid);
            atomic_fetch_add_explicit(&P.done, hi - lo, memory_order_release);
        }
    }
    return NULL;
}

/* A forked child has none of the parent's workers, and its locks may have been held by them. */
static void pool_after_fork(void) {
    pthread_mutex_init(&P.mu, NULL);
    pthread_cond_init(&P.cv, NULL);
    pthread_mutex_init(&P.run, NULL);
    atomic_store(&P.sleepers, 0);
    P.n_workers = 0;
}

static void pool_init(void) { pthread_atfork(NULL, NULL, pool_after_fork); }

/* Start workers up to `want` (the caller excluded); returns how many there are. */
static int pool_grow(int want) {
    while (P.n_workers < want) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int rc = pthread_create(&th, &attr, pool_worker, (void *)(intptr_t)(P.n_workers + 1));
        pthread_attr_destroy(&attr);
        if (rc != 0) break; /* fewer threads, same results */
        P.n_workers++;
    }
    return P.n_workers;
}

int cuca_pool_default_threads(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        const int n = CPU_COUNT(&set);
        if (n > 0) return n < POOL_MAX ? n : POOL_MAX;
    }
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n < POOL_MAX ? (int)n : POOL_MAX;
}

void cuca_pool_run(int n_threads, int64_t n_items, int64_t chunk, cuca_item_fn fn, void *ctx) {
    if (n_items <= 0) return;
    int nt = n_threads > 0 ? n_threads : cuca_pool_default_threads();
    if (nt > POOL_MAX) nt = POOL_MAX;
    if ((int64_t)nt > n_items) nt = (int)n_items;
    pthread_once(&pool_once, pool_init);
    if (nt <= 1 || n_items > MAX_ITEMS || pthread_mutex_trylock(&P.run) != 0) {
        for (int64_t i = 0; i < n_items; i++) fn(ctx, i, 0);
        return;
    }
    const int have = pool_grow(nt - 1) + 1;
    if (nt > have) nt = have;
    if (chunk <= 0) chunk = n_items / ((int64_t)nt * 4) > 1 ? n_items / ((int64_t)nt * 4) : 1;
    /* Close the last job's word before its fields change: a worker that saw that job late may read the new
     * fields (a larger n_items) under the old generation, and its claim would then succeed on items past the old
     * end, run the new job's function before it is published and count them into its done (the caller returned
     * early, freeing what the items read: a use-after-free seen under load). With next = all ones no claim of
     * that generation succeeds whatever n it reads; the generation is unchanged, so no waiter wakes. */
    atomic_store(&P.word, ((uint64_t)P.gen << 32) | 0xFFFFFFFFull);
    atomic_store_explicit(&P.fn, fn, memory_order_relaxed);
    atomic_store_explicit(&P.ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&P.n_items, n_items, memory_order_relaxed);
    atomic_store_explicit(&P.chunk, chunk, memory_order_relaxed);
    atomic_store_explicit(&P.nt, nt, memory_order_relaxed);
    atomic_store_explicit(&P.done, 0, memory_order_relaxed);
    test_sleep(&test_publish_ns); /* a caller descheduled between writing the fields and publishing them */
    if (++P.gen == 0) ++P.gen; /* 0 is the word before any job */
    const uint32_t gen = P.gen;
    atomic_store(&P.word, (uint64_t)gen << 32); /* seq_cst: publishes the fields, then the sleepers are read */
    if (atomic_load(&P.sleepers) > 0) {
        pthread_mutex_lock(&P.mu);
        pthread_cond_broadcast(&P.cv);
        pthread_mutex_unlock(&P.mu);
    }
    int64_t mine = 0, lo, hi;
    while (pool_claim(gen, n_items, chunk, &lo, &hi)) {
        for (int64_t i = lo; i < hi; i++) fn(ctx, i, 0);
        mine += hi - lo;
    }
    /* the items other threads claimed; one descheduled mid-chunk is waited for with the core yielded */
    int64_t t0 = 0;
    for (unsigned k = 1; atomic_load_explicit(&P.done, memory_order_acquire) + mine < n_items; k++) {
        POOL_PAUSE();
        if ((k & 63) == 0) {
            const int64_t t = now_ns();
            if (t0 == 0) t0 = t;
            else if (t - t0 > YIELD_NS) sched_yield();
        }
    }
    pthread_mutex_unlock(&P.run);
}
