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

#endif
