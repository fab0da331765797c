/* Tessel's thread pool for native parallel loops: codegen/llvm.py outlines a parallel loop's body into
   body(closure, threads) and calls tessel_parallel(body, closure, threads, work); link.py compiles this file once
   per target and links it into every native library, so a library needs only libc and pthreads
   (docs/codegen.md, "Threads").

   The rules, each measured on a 2-core VM where a sleeping thread takes 100-200 us to wake:
   - the caller never waits for a worker that has not joined the job: it runs the body itself, claiming chunks
     from the closure's counter, then closes the job and waits only for the workers that joined before it closed.
     A worker that wakes late finds the job closed and touches nothing: the job's fields live in the pool, not on
     the caller's stack, and a worker reads them only once it has joined an open job;
   - a joined worker that is still in its chunk well after the caller finished (descheduled behind another
     process on its CPU) is moved onto the caller's CPU, which the caller then yields to it (rescue, below);
   - idle workers spin for SPIN_NS (or the environment's TESSEL_SPIN_US), bridging the gaps between one kernel's
     loop and the next within a run, yielding the core after YIELD_AFTER_NS so that a caller sharing it runs,
     then sleep on a futex, and a caller wakes them only when the job is large or jobs come densely (below);
   - a model's run entry announces its pooled work as it starts (tessel_pool_run), so a run that will wake sleeping
     workers wakes them then, while its first kernels run;
   - a worker that finds itself on the caller's CPU moves off it (leave_callers_cpu, below), and a caller, at every
     job and before it wakes sleeping workers, takes its CPU out of their affinity (keep_workers_off);
   - one job at a time: a caller that finds the pool busy (another thread's job) runs its loop alone, so two
     threads calling one library at once never share or corrupt a job. */

#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define HIDDEN __attribute__((visibility("hidden")))
#define MAX_WORKERS 63
#define SPIN_NS 300000 /* unless TESSEL_SPIN_US says otherwise, read when the workers start */
/* With another process busy on a worker's CPU, a worker that yields 20 us into each gap between jobs gave that
   process most of the CPU (the worker ran 0.5 ms of a 3.9 ms densenet_block run and joined 6 of its 34 jobs:
   2 threads at 0.9x one thread); at 60 us, with the rescue (below), it kept its share (2.0 ms, 30 jobs) and two
   threads ran at 0.6x one. */
#define YIELD_AFTER_NS 60000
/* Waking a sleeping worker costs the caller 12-16 us here (a futex wake that sends an interrupt to an idle
   virtual CPU), and the worker arrives 10-200 us later: a short run after a pause (small_convnet, 0.3 ms, whose
   largest job is 3.5M operations) lost that much against one thread. So sleepers are woken only once the jobs that
   came within DENSE_NS add up to WAKE_MIN_WORK operations (tir/work.py's estimates, -1 when unknown, which wakes),
   or once DENSE_JOBS jobs have come within it (a model run back to back). Counting jobs alone missed models of
   many jobs just under WAKE_MIN_WORK (densenet_block's 2-3M-operation convs, 0.2 ms each: 8 of them never come
   within 2 ms); with their work summed, a run every 50 ms went 2.15 -> 2.02 ms (densenet_block), 1.36 -> 1.25
   (yolo_neck), 1.99 -> 1.94 (efficientnet_b0), back to back unchanged (two bundles, one process, interleaved). */
#define WAKE_MIN_WORK 4194304
#define DENSE_JOBS 8
#define DENSE_NS 2000000
#define RESCUE_AFTER_NS 20000  /* a closing caller waits at least this (or its own body's time), then rescues */
#define YIELD_FOR_NS 2000000   /* and yields its CPU to the rescued workers this long before it sleeps */
#define OPEN 0x80000000u       /* state: the job accepts workers */
#define WAITING 0x40000000u    /* state: the caller sleeps until the joined workers leave */
#define JOINED 0x3fffffffu     /* state: workers inside the job */

typedef void (*body_fn)(void *closure, int32_t threads);

static struct {
    pthread_mutex_t busy;
    _Atomic uint32_t generation; /* bumped at every job; idle workers sleep on it */
    _Atomic uint32_t state;      /* OPEN | WAITING | joined count; the caller sleeps on it */
    _Atomic uint32_t sleepers;   /* workers that may be asleep on generation */
    body_fn body;
    void *closure;
    int32_t threads;
    int workers;
    int64_t spin_ns;
    int64_t window_start; /* the caller's recent jobs, and their work, within DENSE_NS */
    int recent_jobs;
    int64_t recent_work;
    int caller_cpu;    /* where the job's caller runs, -1 when unknown */
    cpu_set_t allowed; /* the CPUs the process could use when the workers started */
    pthread_t handles[MAX_WORKERS];
    _Atomic int avoided[MAX_WORKERS]; /* the CPU each worker's affinity leaves out, -1: none */
    _Atomic int working[MAX_WORKERS]; /* the worker is inside the body */
    _Atomic int rescued[MAX_WORKERS]; /* the caller moved the worker onto its CPU */
} pool = {.busy = PTHREAD_MUTEX_INITIALIZER};

/* Jobs handed to the pool (a loop kept serial, or run at one thread, never counts), and the times a worker took
part in one: for tests and benchmarks. */
_Atomic uint64_t tessel_pool_jobs, tessel_pool_joins, tessel_pool_run_wakes, tessel_pool_rescues;

static void futex(_Atomic uint32_t *word, int operation, uint32_t value) {
    syscall(SYS_futex, (uint32_t *)word, operation | FUTEX_PRIVATE_FLAG, value, NULL, NULL, 0);
}

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || (defined(__arm__) && __ARM_ARCH >= 7)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec time;
    clock_gettime(CLOCK_MONOTONIC, &time);
    return (int64_t)time.tv_sec * 1000000000 + time.tv_nsec;
}

/* The next generation after `seen`: spin, then yield, then sleep. */
static uint32_t next_generation(uint32_t seen) {
    int64_t started = now_ns();
    for (int round = 0;; round++) {
        uint32_t generation = atomic_load_explicit(&pool.generation, memory_order_acquire);
        if (generation != seen) return generation;
        if ((round & 63) != 63) {
            relax();
            continue;
        }
        int64_t spent = now_ns() - started;
        if (spent > pool.spin_ns) break;
        if (spent > YIELD_AFTER_NS) sched_yield();
    }
    atomic_fetch_add(&pool.sleepers, 1);
    uint32_t generation;
    while ((generation = atomic_load(&pool.generation)) == seen) futex(&pool.generation, FUTEX_WAIT, seen);
    return generation;
}

/* The scheduler may wake a worker onto the CPU of the caller that woke it and leave it there until its periodic
   balancing moves one of them: measured, squeezenet at 2 threads ran at its one-thread speed (1.0 ms against 0.53)
   for the first 5-10 runs after each pause while the worker joined every job, and at 0.54 ms with the worker
   pinned off the caller's CPU. So a worker that finds itself on the caller's CPU takes that CPU out of its
   affinity, which moves it at once; from the process's CPUs, so that it may come back when the caller moves. */
static void leave_callers_cpu(int index, int caller) {
    if (caller < 0 || sched_getcpu() != caller) return;
    cpu_set_t others = pool.allowed;
    CPU_CLR(caller, &others);
    if (CPU_COUNT(&others) > 0 && sched_setaffinity(0, sizeof others, &others) == 0)
        atomic_store(&pool.avoided[index], caller);
}

/* A worker whose affinity still holds the caller's CPU can be left queued behind the caller there:
   - a sleeping worker that the caller wakes is woken where the scheduler chooses, often the caller's CPU, where it
     cannot run until the caller blocks or the periodic balancing moves it, so it cannot even reach
     leave_callers_cpu: measured with a run every 200 ms, yolo_neck's worker joined 4.6 of 19 jobs a run and its
     two threads ran at 1.11x one thread;
   - a caller that sleeps (waiting for a joined worker, or between runs) may wake on the CPU its worker was moved
     to, and then shares it with that worker, which spins there, pinned, until the caller's next job; measured
     with a run every 50 or 200 ms (runs interleaved with those of a pool without this rule), the worker missed more
     than one job in 11 of 100 runs of resnet50_bottleneck and yolo_neck and 16 of 40 of resnet18, and in none with
     it; the slowest quarter of those runs went 4.86 -> 4.50, 2.95 -> 2.67 and 26.9 -> 22.7 ms.
   So at every job, before it is opened (and before a run wakes sleepers), the caller takes its own CPU out of the
   affinity of every worker that does not already leave it out: a comparison per worker, and a system call only when
   the caller has moved. */
static void keep_workers_off(int caller) {
    if (caller < 0) return;
    int moved = 0;
    for (int index = 0; index < pool.workers && !moved; index++) moved = atomic_load(&pool.avoided[index]) != caller;
    if (!moved) return;
    cpu_set_t others = pool.allowed;
    CPU_CLR(caller, &others);
    if (CPU_COUNT(&others) == 0) return;
    for (int index = 0; index < pool.workers; index++) {
        if (atomic_load(&pool.avoided[index]) == caller) continue;
        if (pthread_setaffinity_np(pool.handles[index], sizeof others, &others) == 0)
            atomic_store(&pool.avoided[index], caller);
    }
}

static void *worker(void *argument) {
    int index = (int)(intptr_t)argument; /* workers 0 .. threads-2 take part in a job of `threads` threads */
    uint32_t seen = 0;
    for (;;) {
        seen = next_generation(seen);
        uint32_t state = atomic_load(&pool.state);
        int joined = 0;
        while ((state & OPEN) && !joined) joined = atomic_compare_exchange_weak(&pool.state, &state, state + 1);
        if (!joined) continue;
        int caller = pool.caller_cpu;
        if (index < pool.threads - 1) {
            leave_callers_cpu(index, caller);
            atomic_store(&pool.working[index], 1);
            pool.body(pool.closure, pool.threads);
            atomic_store(&pool.working[index], 0);
            atomic_fetch_add_explicit(&tessel_pool_joins, 1, memory_order_relaxed);
        }
        uint32_t before = atomic_fetch_sub(&pool.state, 1);
        if ((before & JOINED) == 1 && (before & WAITING)) futex(&pool.state, FUTEX_WAKE, 1);
        /* off the caller's CPU again once the caller may go on (a worker that leaves it first queues behind the
           other process and keeps the caller waiting) */
        if (atomic_exchange(&pool.rescued[index], 0)) leave_callers_cpu(index, caller);
    }
    return NULL;
}

/* A caller that has run its chunks and waited (RESCUE_AFTER_NS, or as long as its own body took: a chunk is about
   a quarter of a thread's share, so a worker still in one then has most likely been descheduled; at half the body,
   audio_conv1d's uneven chunks had its worker moved 0.5-0.9 times a run with no other process on the machine)
   moves the workers still inside the body onto its own CPU, which it then yields to them; at once when there are
   more threads than CPUs, where a worker may be queued behind the spinning caller. With another process busy on
   the worker's CPU, the worker otherwise waits there for that process's time slice (0.4-1.4 ms a run of
   densenet_block's 3-4 ms, measured with the pool's own counters); a worker that was only slow loses a migration.
   It is pinned there (the only way to move a queued thread at once) and leaves as soon as it has left the job
   (worker, above); if it does not (it finished before being pinned), keep_workers_off moves it at the caller's
   next job. */
static void rescue(int caller) {
    if (caller < 0) return;
    cpu_set_t mine;
    CPU_ZERO(&mine);
    CPU_SET(caller, &mine);
    for (int index = 0; index < pool.workers; index++) {
        if (!atomic_load(&pool.working[index])) continue;
        if (pthread_setaffinity_np(pool.handles[index], sizeof mine, &mine) != 0) continue;
        atomic_store(&pool.avoided[index], -1);
        atomic_store(&pool.rescued[index], 1);
        atomic_fetch_add_explicit(&tessel_pool_rescues, 1, memory_order_relaxed);
    }
}

/* The cores this process may use, asked once: sched_getaffinity is a system call, ~5 us here. */
static int cores(void) {
    static _Atomic int known;
    int count = atomic_load_explicit(&known, memory_order_relaxed);
    if (count > 0) return count;
    cpu_set_t set;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    count = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : online > 0 ? (int)online : 1;
    atomic_store_explicit(&known, count, memory_order_relaxed);
    return count;
}

/* Start workers until there are `wanted` (the first job at a thread count starts them; the caller holds busy).
   They block every signal, so that signals meant for the process reach the threads that handle them. */
static void start_workers(int wanted) {
    if (pool.workers == 0) {
        const char *text = getenv("TESSEL_SPIN_US");
        pool.spin_ns = text && *text ? atoll(text) * 1000 : SPIN_NS;
        if (sched_getaffinity(0, sizeof pool.allowed, &pool.allowed) != 0) CPU_ZERO(&pool.allowed);
    }
    sigset_t all, saved;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &saved);
    while (pool.workers < wanted) {
        pthread_t thread;
        pthread_attr_t attributes;
        pthread_attr_init(&attributes);
        pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&thread, &attributes, worker, (void *)(intptr_t)pool.workers);
        pthread_attr_destroy(&attributes);
        if (failed) break;
        pool.handles[pool.workers] = thread;
        atomic_store(&pool.avoided[pool.workers], -1);
        pool.workers++;
    }
    pthread_sigmask(SIG_SETMASK, &saved, NULL);
}

/* Called by a model's run entry as the run starts, with the work its parallel loops will hand to the pool (tir/
   work.py's estimates summed over the run, -1 when unknown): a run is the dense sequence of jobs that the pool
   otherwise sees only job by job, so when the run's work would wake sleepers, they are woken now and arrive while
   the first kernels run. A bumped generation with no job open sends them back to spinning. */
HIDDEN void tessel_pool_run(int32_t threads, int64_t work) {
    if (threads <= 0) threads = cores();
    if (threads == 1 || pool.workers == 0 || (work >= 0 && work < WAKE_MIN_WORK)) return;
    if (atomic_load(&pool.sleepers) == 0 || pthread_mutex_trylock(&pool.busy) != 0) return;
    if (atomic_exchange(&pool.sleepers, 0) != 0) {
        atomic_fetch_add(&pool.generation, 1);
        keep_workers_off(sched_getcpu());
        futex(&pool.generation, FUTEX_WAKE, MAX_WORKERS);
        atomic_fetch_add_explicit(&tessel_pool_run_wakes, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&pool.busy);
}

HIDDEN void tessel_parallel(body_fn body, void *closure, int32_t threads, int64_t work) {
    if (threads <= 0) threads = cores();
    if (threads > MAX_WORKERS + 1) threads = MAX_WORKERS + 1;
    if (threads == 1 || pthread_mutex_trylock(&pool.busy) != 0) {
        body(closure, 1);
        return;
    }
    if (pool.workers < threads - 1) start_workers(threads - 1);
    if (pool.workers < threads - 1) threads = pool.workers + 1;
    pool.body = body;
    pool.closure = closure;
    pool.threads = threads;
    pool.caller_cpu = sched_getcpu();
    keep_workers_off(pool.caller_cpu);
    atomic_fetch_add_explicit(&tessel_pool_jobs, 1, memory_order_relaxed);
    atomic_store(&pool.state, OPEN);
    atomic_fetch_add(&pool.generation, 1);
    int64_t now = now_ns();
    if (now - pool.window_start > DENSE_NS) {
        pool.window_start = now;
        pool.recent_jobs = 0;
        pool.recent_work = 0;
    }
    pool.recent_jobs++;
    pool.recent_work += work;
    int worth_waking = work < 0 || pool.recent_work >= WAKE_MIN_WORK || pool.recent_jobs >= DENSE_JOBS;
    if (worth_waking && atomic_exchange(&pool.sleepers, 0) != 0) {
        futex(&pool.generation, FUTEX_WAKE, MAX_WORKERS);
    }
    int64_t started = now_ns();
    body(closure, threads);
    int64_t finished = now_ns();
    uint32_t state = atomic_fetch_and(&pool.state, ~OPEN) & ~OPEN;
    int64_t patience = finished - started > RESCUE_AFTER_NS ? finished - started : RESCUE_AFTER_NS;
    if (threads > cores()) patience = 0;
    for (int round = 1; (state & JOINED) && ((round & 63) || now_ns() - finished < patience); round++) {
        relax();
        state = atomic_load(&pool.state);
    }
    if (state & JOINED) {
        rescue(pool.caller_cpu);
        for (int64_t yielding = now_ns(); (state & JOINED) && now_ns() - yielding < YIELD_FOR_NS;) {
            sched_yield();
            state = atomic_load(&pool.state);
        }
    }
    if (state & JOINED) {
        state = atomic_fetch_or(&pool.state, WAITING) | WAITING;
        while (state & JOINED) {
            futex(&pool.state, FUTEX_WAIT, state);
            state = atomic_load(&pool.state);
        }
    }
    pthread_mutex_unlock(&pool.busy);
}
