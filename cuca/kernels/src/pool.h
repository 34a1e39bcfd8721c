/* The kernels' thread pool: run items 0..n-1 of a job on up to n_threads threads, the caller included.
 *
 * Why not OpenMP: an OpenMP region ends in a barrier that every thread of the team must reach, so a thread the
 * OS has descheduled (another process busy on its core) stalls every region for a time slice, and spinning
 * workers eat the CPU that busy process and the caller need (measured: 10x slower decode under load). Here the
 * caller never waits for a worker to start: items are claimed in chunks from one atomic counter, the caller
 * claims too, and the job is done when every claimed item is; a worker that wakes late finds nothing to do.
 * Workers spin for a bounded time after a job (the next one follows within microseconds inside a pass), then
 * sleep. Which thread runs an item never changes what the item computes (batch invariance is the kernels'). */
#ifndef CUCA_POOL_H
#define CUCA_POOL_H
#include <stdint.h>

/* One item of a job: `tid` in [0, n_threads) names the thread (for per-thread scratch), 0 is the caller. */
typedef void (*cuca_item_fn)(void *ctx, int64_t item, int tid);

/* Run fn(ctx, i, tid) once for every i in [0, n_items), claimed `chunk` items at a time (chunk <= 0: chosen
 * from n_items and the threads). n_threads <= 0: the CPUs this process may run on. One job runs at a time: a
 * call made while another thread's job runs is computed on the calling thread alone (same results). */
void cuca_pool_run(int n_threads, int64_t n_items, int64_t chunk, cuca_item_fn fn, void *ctx);

/* The threads a call with n_threads <= 0 uses: the CPUs in this process's affinity mask. */
int cuca_pool_default_threads(void);

/* Test only (tests/test_pool.py): make the pool's hand-over races happen on demand, as if the OS descheduled a
 * thread there. A worker sleeps wait_ns after it sees a new job and before it reads the job's fields; a caller
 * sleeps publish_ns after writing a job's fields and before publishing them. 0 (the default) is off. Returns the
 * times since the last call that a delayed worker read the fields while its job was closed and the next one not
 * yet published (the race window, reached), and restarts that count. */
int64_t cuca_pool_test_delays(int64_t wait_ns, int64_t publish_ns);

typedef struct {
    int n_threads;               /* >= 2 */
    int n_jobs;                  /* run one after another from the calling thread: small, large, small, ... */
    int64_t small, large;        /* items of each job (claimed one at a time) */
    int64_t item_ns;             /* each item's busy time, so that an item still running at a return is seen */
    int64_t wait_ns, publish_ns; /* cuca_pool_test_delays during the jobs */
} cuca_pool_selftest_args;

typedef struct {
    int64_t runs;       /* items that did not run exactly once (counted after the last job, once late ones landed) */
    int64_t wrong;      /* item calls with another job's function or an index out of the job's range */
    int64_t early;      /* jobs whose finished item count was not n_items when cuca_pool_run returned */
    int64_t windows;    /* times a worker read fields in the race window (> 0: the test provoked the race) */
    int64_t by_workers; /* items the workers ran (not a violation) */
} cuca_pool_selftest_result;

/* Run a->n_jobs pool jobs with the test delays on and count what a correct pool never does (pool_test.c).
 * Returns runs + wrong + early (0: no violation), or a negative CUCA_E* code. One call at a time per process;
 * other pool users meanwhile get the delays too. */
int64_t cuca_pool_selftest(const cuca_pool_selftest_args *a, cuca_pool_selftest_result *r);

#endif
