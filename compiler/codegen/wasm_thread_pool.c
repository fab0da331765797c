/* Tessel's thread pool for threaded wasm modules (wasm32 + atomics over an imported shared memory): the wasm
   counterpart of thread_pool.c, with the same call, tessel_parallel(body, closure, threads, work), which
   codegen/llvm.py emits for a parallel loop. link.py compiles this file with zig cc and links it into every
   threaded module. The host (web_runtime/tessel.js) starts workers; each instantiates the same module over the same
   memory, gives itself its own stack (__stack_pointer) and calls tessel_worker(), which never returns. A host that
   starts none (wasmtime in compiler/runtime/wasm.py) gets every parallel loop run on the calling thread.

   The rules are thread_pool.c's (docs/codegen.md, "Threads"):
   - the caller never waits for a worker that has not joined: it runs the body itself, claiming chunks from the
     closure's counter, then closes the job and waits only for the workers that joined before it closed;
   - the caller spins for them and never sleeps, because a browser's main thread may not memory.atomic.wait;
   - idle workers spin SPIN_ROUNDS rounds (the gaps between one kernel's loop and the next within a run), then sleep
     with memory.atomic.wait32; a caller wakes them only for a large job or after DENSE_JOBS jobs without waking
     (wasm has no clock of its own to tell a dense sequence of jobs from a sparse one);
   - a model's run entry calls tessel_pool_run() as the run starts, with its loops' work summed at compile time: a
     run is the dense sequence the pool cannot see, so the workers are woken then, while the first kernels run, if
     that work reaches RUN_WAKE_MIN_WORK. */

#include <stdatomic.h>
#include <stdint.h>

#define EXPORT(name) __attribute__((export_name(name)))
/* Rounds of one atomic load each before a worker sleeps: enough to bridge the gaps between one kernel's loop and the
   next within a run. A spinning worker takes a core from whoever else runs: on the shared 2-core machine (load 9-11),
   mobilenet_v2 at 2 threads took a median 54 ms with 200000 rounds against 48 ms with 20000 rounds and 48 ms on one
   thread (five Node processes, each 30 runs of the three interleaved). */
#define SPIN_ROUNDS 20000
#define WAKE_MIN_WORK 4194304
#define DENSE_JOBS 8
/* A run whose loops do this much work takes ~100 us on one thread here (unusual_shapes in benchmarks/wasm.py: 4.5M
   operations, 0.5 ms), while a woken worker arrives 20-60 us after the notify, which costs the caller a few us. */
#define RUN_WAKE_MIN_WORK 1048576
#define OPEN 0x80000000u   /* state: the job accepts workers */
#define JOINED 0x7fffffffu /* state: workers inside the job */

typedef void (*body_fn)(void *closure, int32_t threads);

static struct {
    _Atomic uint32_t generation; /* bumped at every job; idle workers sleep on it */
    _Atomic uint32_t state;      /* OPEN | joined count */
    _Atomic uint32_t sleepers;   /* workers that may be asleep on generation */
    _Atomic int32_t workers;     /* workers that have entered tessel_worker */
    _Atomic uint32_t busy;       /* a job is being dispatched */
    body_fn body;
    void *closure;
    int32_t threads;
    int32_t jobs_since_wake;
} pool;

/* Jobs handed to the pool and the times a worker took part in one, for tests and benchmarks. */
static _Atomic uint32_t jobs, joins;

EXPORT("tessel_pool_jobs") uint32_t tessel_pool_jobs(void) { return atomic_load(&jobs); }
EXPORT("tessel_pool_joins") uint32_t tessel_pool_joins(void) { return atomic_load(&joins); }
EXPORT("tessel_pool_workers") int32_t tessel_pool_workers(void) { return atomic_load(&pool.workers); }

/* While the job a worker last saw is still open (the caller finishing its own last chunk, up to an eighth of a loop
   at 2 threads), rounds count a quarter: so the spin still bridges the gap to the next job after a long tail, and a
   worker still sleeps when the caller is descheduled (on a busy machine an unbounded spin took the core the caller
   needed: mobilenet_v2 ran at half the one-thread speed beside a busy process). */
static uint32_t next_generation(uint32_t seen) {
    for (int round = 0; round < 4 * SPIN_ROUNDS;) {
        uint32_t generation = atomic_load_explicit(&pool.generation, memory_order_acquire);
        if (generation != seen) return generation;
        round += atomic_load_explicit(&pool.state, memory_order_relaxed) & OPEN ? 1 : 4;
    }
    atomic_fetch_add(&pool.sleepers, 1);
    uint32_t generation;
    while ((generation = atomic_load(&pool.generation)) == seen) {
        __builtin_wasm_memory_atomic_wait32((int32_t *)&pool.generation, (int32_t)seen, -1);
    }
    return generation;
}

/* A worker's whole life: join open jobs until the host terminates it. Workers number themselves in the order they
   arrive, and a job of `threads` threads takes workers 0 .. threads-2. */
EXPORT("tessel_worker") void tessel_worker(void) {
    uint32_t seen = atomic_load(&pool.generation);
    int32_t index = atomic_fetch_add(&pool.workers, 1);
    for (;;) {
        seen = next_generation(seen);
        uint32_t state = atomic_load(&pool.state);
        int joined = 0;
        while ((state & OPEN) && !joined) joined = atomic_compare_exchange_weak(&pool.state, &state, state + 1);
        if (!joined) continue;
        if (index < pool.threads - 1) {
            pool.body(pool.closure, pool.threads);
            atomic_fetch_add_explicit(&joins, 1, memory_order_relaxed);
        }
        atomic_fetch_sub(&pool.state, 1);
    }
}

static void wake_sleepers(void) {
    if (atomic_exchange(&pool.sleepers, 0) == 0) return;
    pool.jobs_since_wake = 0;
    __builtin_wasm_memory_atomic_notify((int32_t *)&pool.generation, (uint32_t)-1);
}

/* Called by a model's run entry as the run starts, with its pooled loops' work summed at compile time (-1: unknown):
   wakes the sleepers when that is enough work. A bumped generation with no job open sends them back to spinning. */
void tessel_pool_run(int32_t threads, int64_t work) {
    if (threads == 1 || (work >= 0 && work < RUN_WAKE_MIN_WORK) || atomic_load(&pool.sleepers) == 0) return;
    atomic_fetch_add(&pool.generation, 1);
    wake_sleepers();
}

void tessel_parallel(body_fn body, void *closure, int32_t threads, int64_t work) {
    int32_t available = atomic_load(&pool.workers) + 1;
    if (threads <= 0 || threads > available) threads = available;
    uint32_t idle = 0;
    if (threads == 1 || !atomic_compare_exchange_strong(&pool.busy, &idle, 1)) {
        body(closure, 1);
        return;
    }
    pool.body = body;
    pool.closure = closure;
    pool.threads = threads;
    atomic_fetch_add_explicit(&jobs, 1, memory_order_relaxed);
    atomic_store(&pool.state, OPEN);
    atomic_fetch_add(&pool.generation, 1);
    if (work < 0 || work >= WAKE_MIN_WORK || ++pool.jobs_since_wake >= DENSE_JOBS) wake_sleepers();
    body(closure, threads);
    uint32_t state = atomic_fetch_and(&pool.state, ~OPEN) & ~OPEN;
    while (state & JOINED) state = atomic_load(&pool.state);
    atomic_store(&pool.busy, 0);
}
