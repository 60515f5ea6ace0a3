#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "threadpool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define PG_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define PG_CPU_RELAX() __asm__ volatile("yield")
#else
#define PG_CPU_RELAX() ((void)0)
#endif

/* Spin this many rounds before sleeping. Spinning bridges the short gaps between the nodes of one
 * graph; beyond that a waiting thread sleeps, so that on a busy machine (more runnable threads
 * than cores) it does not burn the time slice its partner needs. */
#define PG_SPIN_ROUNDS       256    /* pause-spins before yielding the core             */
#define PG_YIELD_ROUNDS     2000    /* sched_yield rounds before sleeping (about 1 ms): */
                                    /* cheap when the core is ours alone, and when two  */
                                    /* threads share one core it hands it over at once */

/* Sleep while *addr == val / wake all sleepers on addr (Linux futex; elsewhere yield). */
static void wait_on(atomic_int *addr, int val) {
#if defined(__linux__)
    syscall(SYS_futex, (int *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
#else
    (void)addr; (void)val;
    sched_yield();
#endif
}

static void wake_all(atomic_int *addr) {
#if defined(__linux__)
    syscall(SYS_futex, (int *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
    (void)addr;
#endif
}

typedef struct { pg_threadpool *tp; int ith; } worker_arg;

static void *worker_main(void *p) {
    worker_arg *wa = p;
    pg_threadpool *tp = wa->tp;
    const int ith = wa->ith;
    free(wa);
    int seen = 0;   /* generation at pool creation: a job published before this thread ran is still seen */
    for (;;) {
        int spins = 0;
        while (atomic_load_explicit(&tp->generation, memory_order_acquire) == seen &&
               !atomic_load(&tp->stop)) {
            if (++spins < PG_SPIN_ROUNDS) { PG_CPU_RELAX(); continue; }
            if (spins < PG_SPIN_ROUNDS + PG_YIELD_ROUNDS) { sched_yield(); continue; }
            pthread_mutex_lock(&tp->mu);
            while (atomic_load(&tp->generation) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->cv, &tp->mu);
            pthread_mutex_unlock(&tp->mu);
        }
        if (atomic_load(&tp->stop)) break;
        seen = atomic_load(&tp->generation);
        if (ith < tp->nth) tp->fn(tp->arg, ith, tp->nth);
        /* every worker acknowledges every job, taking part or not: the next job is published
         * only when no worker can still be reading this one's fn/arg/nth */
        atomic_fetch_add_explicit(&tp->n_done, 1, memory_order_release);
    }
    return NULL;
}

/* ---- registry of live pools ------------------------------------------------------------------ */

static pthread_mutex_t g_reg_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t  g_reg_cv = PTHREAD_COND_INITIALIZER;   /* a pool's users dropped to 0 */
static pg_threadpool  *g_live = NULL;

/* The link that points at tp in the live list, or NULL. Caller holds g_reg_mu. */
static pg_threadpool **find_live(const pg_threadpool *tp) {
    for (pg_threadpool **l = &g_live; *l; l = &(*l)->next_live)
        if (*l == tp) return l;
    return NULL;
}

int32_t pg_threadpool_acquire(pg_threadpool *tp) {
    pthread_mutex_lock(&g_reg_mu);
    const int live = tp && find_live(tp) != NULL;
    if (live) tp->users++;
    pthread_mutex_unlock(&g_reg_mu);
    return live ? PG_OK : PG_ERR_CLOSED;
}

void pg_threadpool_release(pg_threadpool *tp) {
    pthread_mutex_lock(&g_reg_mu);
    if (--tp->users == 0) pthread_cond_broadcast(&g_reg_cv);
    pthread_mutex_unlock(&g_reg_mu);
}

/* Stops and joins the first n_workers workers, then frees tp (not registered, no users). */
static void destroy(pg_threadpool *tp, int n_workers) {
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->stop, 1);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 0; i < n_workers; i++) pthread_join(tp->threads[i], NULL);
    pthread_mutex_destroy(&tp->run_mu);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv);
    free(tp->threads);
    free(tp);
}

pg_threadpool *pg_threadpool_new(int32_t n_threads) {
    if (n_threads < 1 || n_threads > PG_MAX_THREADS) return NULL;
    pg_threadpool *tp = calloc(1, sizeof(*tp));
    if (!tp) return NULL;
    tp->n_max = n_threads;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);
    pthread_mutex_init(&tp->run_mu, NULL);
    tp->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!tp->threads) { destroy(tp, 0); return NULL; }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof(*wa));
        if (!wa) { destroy(tp, i - 1); return NULL; }
        wa->tp = tp;
        wa->ith = i;
        if (pthread_create(&tp->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            destroy(tp, i - 1);
            return NULL;
        }
    }
    pthread_mutex_lock(&g_reg_mu);
    tp->next_live = g_live;
    g_live = tp;
    pthread_mutex_unlock(&g_reg_mu);
    return tp;
}

void pg_threadpool_free(pg_threadpool *tp) {
    pthread_mutex_lock(&g_reg_mu);
    pg_threadpool **link = tp ? find_live(tp) : NULL;
    if (!link) {                    /* NULL, already freed or never a pool: nothing to do */
        pthread_mutex_unlock(&g_reg_mu);
        return;
    }
    *link = tp->next_live;          /* from now on every acquire refuses it */
    while (tp->users > 0) pthread_cond_wait(&g_reg_cv, &g_reg_mu);   /* computes in flight */
    pthread_mutex_unlock(&g_reg_mu);
    destroy(tp, tp->n_max - 1);
}

int32_t pg_threadpool_n_threads(const pg_threadpool *tp) {
    pthread_mutex_lock(&g_reg_mu);
    const int32_t n = tp && find_live(tp) ? tp->n_max : 0;
    pthread_mutex_unlock(&g_reg_mu);
    return n;
}

void pg_threadpool_run(pg_threadpool *tp, pg_job_fn fn, void *arg, int nth) {
    if (nth <= 1 || tp->n_max <= 1) {
        fn(arg, 0, 1);
        return;
    }
    if (nth > tp->n_max) nth = tp->n_max;
    /* one job at a time: two callers publishing at once would share fn/arg/n_done */
    pthread_mutex_lock(&tp->run_mu);
    tp->fn = fn;
    tp->arg = arg;
    tp->nth = nth;
    atomic_store(&tp->n_done, 0);
    atomic_store(&tp->bar_count, 0);
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add_explicit(&tp->generation, 1, memory_order_release);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    fn(arg, 0, nth);
    while (atomic_load_explicit(&tp->n_done, memory_order_acquire) < tp->n_max - 1)
        PG_CPU_RELAX();
    pthread_mutex_unlock(&tp->run_mu);
}

void pg_threadpool_barrier(pg_threadpool *tp, int nth) {
    if (nth <= 1) return;
    const int gen = atomic_load(&tp->bar_gen);
    if (atomic_fetch_add(&tp->bar_count, 1) == nth - 1) {
        atomic_store(&tp->bar_count, 0);
        atomic_fetch_add(&tp->bar_gen, 1);
        /* seq_cst: a sleeper counted itself before re-checking bar_gen, so either it sees the
         * new generation or we see it and wake it */
        if (atomic_load(&tp->bar_sleepers)) wake_all(&tp->bar_gen);
        return;
    }
    int spins = 0;
    while (atomic_load_explicit(&tp->bar_gen, memory_order_acquire) == gen) {
        if (++spins < PG_SPIN_ROUNDS) { PG_CPU_RELAX(); continue; }
        if (spins < PG_SPIN_ROUNDS + PG_YIELD_ROUNDS) { sched_yield(); continue; }
        atomic_fetch_add(&tp->bar_sleepers, 1);
        if (atomic_load(&tp->bar_gen) == gen) wait_on(&tp->bar_gen, gen);
        atomic_fetch_sub(&tp->bar_sleepers, 1);
    }
}
