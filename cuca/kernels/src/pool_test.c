/* The pool's self-test (pool.h, cuca_pool_selftest): jobs that alternate small and large, run with the test
 * delays on so that a worker that saw a small job reads the next, larger job's fields before the caller has
 * published them (the window d94ddf9 closed). Both delays are needed: the caller's is the window (after it, claims
 * under the old generation fail), the worker's puts a worker in it whether it was spinning or asleep. Each item
 * records its job, its runs and its end; nothing is printed. */
#define _GNU_SOURCE
#include "cuca.h"
#include "pool.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#define ST_MAX_ITEMS (1 << 20) /* per job */
#define ST_MAX_NS 1000000000LL /* any one delay or item time */
#define ST_SETTLE_NS 20000000L /* after the last job: a broken pool's late items land before the count */

typedef struct {
    int64_t n;        /* items */
    int kind;         /* the item function the job was run with: 0 st_small, 1 st_large */
    int64_t item_ns;  /* busy time of each item */
    atomic_int *runs; /* per item: times run */
    atomic_llong finished, wrong, by_workers;
} st_job;

static int64_t st_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void st_item(st_job *j, int64_t item, int tid, int kind) {
    if (kind != j->kind || item < 0 || item >= j->n) {
        atomic_fetch_add(&j->wrong, 1);
        return;
    }
    atomic_fetch_add(&j->runs[item], 1);
    if (tid) atomic_fetch_add(&j->by_workers, 1);
    const int64_t t0 = st_now();
    while (st_now() - t0 < j->item_ns) continue;
    atomic_fetch_add(&j->finished, 1);
}

/* two functions, so that an item run with another job's function is seen */
static void st_small(void *ctx, int64_t item, int tid) { st_item(ctx, item, tid, 0); }
static void st_large(void *ctx, int64_t item, int tid) { st_item(ctx, item, tid, 1); }

int64_t cuca_pool_selftest(const cuca_pool_selftest_args *a, cuca_pool_selftest_result *r) {
    *r = (cuca_pool_selftest_result){0};
    if (a->n_threads < 2 || a->n_jobs < 1 || a->small < 1 || a->large < a->small || a->large > ST_MAX_ITEMS ||
        a->item_ns < 0 || a->item_ns > ST_MAX_NS || a->wait_ns < 0 || a->wait_ns > ST_MAX_NS || a->publish_ns < 0 ||
        a->publish_ns > ST_MAX_NS)
        return CUCA_EINVAL;
    const int64_t n_large = a->n_jobs / 2, total = (a->n_jobs - n_large) * a->small + n_large * a->large;
    st_job *jobs = calloc((size_t)a->n_jobs, sizeof *jobs);
    atomic_int *runs = calloc((size_t)total, sizeof *runs);
    if (!jobs || !runs) {
        free(jobs);
        free(runs);
        return CUCA_ENOMEM;
    }
    (void)cuca_pool_test_delays(a->wait_ns, a->publish_ns);
    for (int64_t k = 0, off = 0; k < a->n_jobs; k++) {
        st_job *j = &jobs[k];
        j->kind = (int)(k & 1);
        j->n = j->kind ? a->large : a->small;
        j->item_ns = a->item_ns;
        j->runs = runs + off;
        off += j->n;
        cuca_pool_run(a->n_threads, j->n, 1, j->kind ? st_large : st_small, j);
        if (atomic_load(&j->finished) != j->n) r->early++;
    }
    r->windows = cuca_pool_test_delays(0, 0);
    nanosleep(&(struct timespec){.tv_sec = 0, .tv_nsec = ST_SETTLE_NS}, NULL);
    for (int64_t k = 0; k < a->n_jobs; k++) {
        for (int64_t i = 0; i < jobs[k].n; i++) r->runs += atomic_load(&jobs[k].runs[i]) != 1;
        r->wrong += atomic_load(&jobs[k].wrong);
        r->by_workers += atomic_load(&jobs[k].by_workers);
    }
    const int64_t violations = r->runs + r->wrong + r->early;
    if (violations == 0) { /* else leaked: a broken pool's late worker may still write them */
        free(jobs);
        free(runs);
    }
    return violations;
}
