/* A persistent thread pool: worker 0 is the calling thread; workers spin briefly between jobs,
 * then sleep on a condition variable. One job = one function run by n threads, with a barrier.
 *
 * Live pools are kept in a registry: a pool handle is used only through pg_threadpool_acquire,
 * which refuses a pool that was freed (PG_ERR_CLOSED) by comparing the pointer with the live
 * ones, never reading through it. Jobs on one pool are serialized (run_mu); freeing waits for
 * the jobs that acquired the pool before it was unregistered. */
#ifndef PG_THREADPOOL_H
#define PG_THREADPOOL_H

#include <stdatomic.h>
#include <pthread.h>

#include "pyggml.h"

typedef void (*pg_job_fn)(void *arg, int ith, int nth);

struct pg_threadpool {
    int              n_max;          /* threads including the caller */
    pthread_t       *threads;        /* n_max - 1 workers */
    pthread_mutex_t  mu;
    pthread_cond_t   cv;
    atomic_int       generation;     /* bumped to publish a job */
    atomic_int       n_done;         /* workers finished with the current job */
    atomic_int       stop;
    pg_job_fn        fn;
    void            *arg;
    int              nth;            /* threads taking part in the current job */
    /* barrier */
    atomic_int       bar_count;
    atomic_int       bar_gen;
    atomic_int       bar_sleepers;   /* threads asleep in the barrier (futex on bar_gen) */
    /* lifetime (guarded by the registry lock) and job serialization */
    pg_threadpool   *next_live;      /* registry list */
    int              users;          /* acquired and not yet released */
    pthread_mutex_t  run_mu;         /* one job at a time */
};

/* PG_OK and the pool counted as in use, or PG_ERR_CLOSED if tp is not a live pool (freed, or
 * never created). Every PG_OK must be paired with one pg_threadpool_release. */
int32_t pg_threadpool_acquire(pg_threadpool *tp);
void pg_threadpool_release(pg_threadpool *tp);

/* Runs fn(arg, ith, nth) on nth threads (caller is ith 0) and returns when all are done; the
 * caller holds an acquired pool. Concurrent callers wait for each other. */
void pg_threadpool_run(pg_threadpool *tp, pg_job_fn fn, void *arg, int nth);
/* All nth threads of the current job wait for each other. */
void pg_threadpool_barrier(pg_threadpool *tp, int nth);

#endif
