/* A persistent thread pool: worker 0 is the calling thread; workers spin briefly between jobs,
 * then sleep on a condition variable. One job = one function run by n threads, with a barrier. */
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
};

/* Runs fn(arg, ith, nth) on nth threads (caller is ith 0) and returns when all are done. */
void pg_threadpool_run(pg_threadpool *tp, pg_job_fn fn, void *arg, int nth);
/* All nth threads of the current job wait for each other. */
void pg_threadpool_barrier(pg_threadpool *tp, int nth);

#endif
