// The subset of CUDA C++ that chainer-lars's kernels use, for the host.
//
// cuda_emulator.py compiles a kernel source with the system C++ compiler
// after this header and runs its launches on the CPU:
//
// - Every thread of a block is a fiber with its own stack, and the threads
//   of a block take turns on one OS thread (EMU_FIBERS_PER_THREAD, 1024 by
//   default: compile with -DEMU_FIBERS_PER_THREAD=32 for an OS thread per
//   warp, the warps then running concurrently). Each thread runs until it
//   waits at a barrier or leaves the kernel, then the next one runs, so a
//   missing __syncthreads() shows up as reading what a later thread has not
//   written yet. A thread that runs for EMU_SLICE_MS without reaching a
//   barrier is preempted (a signal), so a thread spinning until another
//   thread of its block acts lets that thread run, as on a GPU. (Threads
//   share an OS thread: kernel code must not take the C library's locks,
//   e.g. printf, which device code does not have anyway.) One OS thread a
//   block, because on busy cores every barrier of a block spread over
//   several would wait for each of them to be scheduled again (a launch
//   then took 2 to 6 times as long as on idle cores).
//   Blocks run one after another on the same threads, which is one of the
//   orders a GPU may choose; __shared__ memory is one static copy, reused by
//   every block (and, as on a GPU, not cleared between blocks).
// - Fibers switch with a few instructions of their own on x86-64 (the
//   registers a call keeps, and the SSE and x87 control words), with
//   ucontext's swapcontext elsewhere (which also makes a system call to
//   save and restore the signal mask at every switch).
// - __syncthreads() is a barrier across all the threads of the block. A
//   barrier that some threads reach while others have left the kernel (a
//   divergent __syncthreads) is reported as an error of the launch, not a
//   hang; so is a launch still running after EMU_TIMEOUT_MS (or what
//   emu_set_timeout_ms set): its threads waiting at a barrier are released
//   and those still running are abandoned once preempted, their fibers
//   started afresh at the next launch.
// - threadIdx and blockIdx are per thread; blockDim and gridDim per launch.
// - atomicAdd on unsigned int, and __threadfence() as a full fence.
// - The float16 conversions of the PTX instructions cvt.f32.f16 and
//   cvt.rn.f16.f32 (exact widening; narrowing rounded to nearest-even, with
//   subnormals, overflow to inf and NaN as the hardware does). The
//   emulator replaces the sources' inline asm of exactly these two
//   instructions with calls of emu_cvt_f32_f16 / emu_cvt_rn_f16_f32; any
//   other asm is refused.
// - Float arithmetic is the host's IEEE arithmetic, without contraction
//   into fused multiply-adds (nvcc and NVRTC contract by default), so
//   results may differ from a GPU's in the last bit.

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <functional>
#include <thread>
#include <vector>

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__ __restrict

using std::sqrt;

// Everything here has internal linkage (an unnamed namespace), so that each
// compiled module has its own state: ctypes loads every module into the one
// process, where GCC would otherwise share the static locals of inline
// functions (STB_GNU_UNIQUE) between them.
namespace {

struct emu_dim3 {
    unsigned int x = 1, y = 1, z = 1;
};

static thread_local emu_dim3 threadIdx;
static thread_local emu_dim3 blockIdx;
static emu_dim3 blockDim;
static emu_dim3 gridDim;

#ifndef EMU_TIMEOUT_MS
#define EMU_TIMEOUT_MS 60000
#endif

#ifndef EMU_SLICE_MS
#define EMU_SLICE_MS 2
#endif

#ifndef EMU_FIBERS_PER_THREAD
#define EMU_FIBERS_PER_THREAD 1024
#endif

#ifndef EMU_STACK
#define EMU_STACK (256 * 1024)
#endif

struct emu_worker;

// The OS thread's worker, for the barrier and the preemption signal.
static thread_local emu_worker* emu_self = nullptr;

// A reusable barrier for the threads of one block that also knows why each
// thread arrived: at a __syncthreads() or at the end of the kernel.
struct emu_barrier {
    int size = 0;
    std::atomic<int> arrived{0};
    std::atomic<int> exited{0};
    std::atomic<long> phase{0};
    std::atomic<int> failed{0};  // 0 ok, 1 divergent, 2 timeout

    void reset(int n) {
        size = n;
        arrived = 0;
        exited = 0;
        phase = 0;
        failed = 0;
    }

    // Returns after every thread has arrived in this phase.
    void arrive(bool at_exit);
};
static emu_barrier emu_block_barrier;

__device__ __forceinline__ void __syncthreads() {
    emu_block_barrier.arrive(false);
}

__device__ __forceinline__ unsigned int atomicAdd(unsigned int* address,
                                                  unsigned int value) {
    return std::atomic_ref<unsigned int>(*address).fetch_add(value);
}

__device__ __forceinline__ void __threadfence() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
}

__device__ __forceinline__ float emu_cvt_f32_f16(unsigned short h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    uint32_t bits;
    if (e == 0x1f) {
        // inf, or a NaN made quiet with its payload kept
        bits = sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u);
    } else if (e == 0) {
        float f = std::ldexp((float)m, -24);  // zero or subnormal: exact
        std::memcpy(&bits, &f, 4);
        bits |= sign;
    } else {
        bits = sign | ((e + 112u) << 23) | (m << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

__device__ __forceinline__ unsigned short emu_cvt_rn_f16_f32(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) {
        // NaN: quiet, the top payload bits kept
        return (unsigned short)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    }
    if (a >= 0x477ff000u) {
        return (unsigned short)(sign | 0x7c00u);  // >= 65520: inf
    }
    uint32_t e = a >> 23;
    if (e < 113) {
        // below 2^-14: a subnormal half (or zero), rounded to nearest-even
        if (e < 102) {
            return (unsigned short)sign;  // below 2^-25
        }
        uint32_t mant = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;
        uint32_t q = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) {
            ++q;
        }
        return (unsigned short)(sign | q);
    }
    uint32_t r = a - (112u << 23);
    uint32_t q = r >> 13;
    uint32_t rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) {
        ++q;
    }
    return (unsigned short)(sign | q);
}

static char emu_error[512];
static std::atomic<int> emu_timeout_ms{EMU_TIMEOUT_MS};

}  // namespace

extern "C" const char* emu_last_error() {
    return emu_error;
}

// The time a launch may run before it fails, from the next launch on.
extern "C" void emu_set_timeout_ms(int ms) {
    emu_timeout_ms.store(ms > 0 ? ms : EMU_TIMEOUT_MS);
}

#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
// emu_fiber_switch(save, load): pushes the registers a call keeps and the
// SSE and x87 control words, saves the stack pointer in *save, and pops
// the same from the stack at load. emu_fiber_start begins a fiber: it
// calls r13 (the entry) with r12 (the fiber), as emu_context_make sets
// them up.
extern "C" void emu_fiber_switch(void** save, void* load);
extern "C" void emu_fiber_start();
asm(R"(
    .text
    .globl emu_fiber_switch
    .hidden emu_fiber_switch
    .type emu_fiber_switch, @function
emu_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_fiber_switch, .-emu_fiber_switch
    .globl emu_fiber_start
    .hidden emu_fiber_start
    .type emu_fiber_start, @function
emu_fiber_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size emu_fiber_start, .-emu_fiber_start
)");
#define EMU_OWN_SWITCH 1
#else
#define EMU_OWN_SWITCH 0
#endif

namespace {

struct emu_fiber;

// Where a fiber, or a worker's scheduler, resumes.
struct emu_context {
#if EMU_OWN_SWITCH
    void* sp = nullptr;
#else
    ucontext_t uc;
#endif
};

static inline void emu_switch(emu_context* from, emu_context* to) {
#if EMU_OWN_SWITCH
    emu_fiber_switch(&from->sp, to->sp);
#else
    swapcontext(&from->uc, &to->uc);
#endif
}

static void emu_fiber_main(emu_fiber* f);

#if !EMU_OWN_SWITCH
static void emu_fiber_main_words(unsigned int low, unsigned int high) {
    emu_fiber_main((emu_fiber*)(((uintptr_t)high << 32) | low));
}
#endif

// Sets up c to start emu_fiber_main(f) on the stack [stack, stack + size).
static void emu_context_make(emu_context* c, char* stack, size_t size,
                             emu_fiber* f) {
#if EMU_OWN_SWITCH
    // The stack as emu_fiber_switch leaves it, from the top: a return
    // address (emu_fiber_start, after whose ret the stack is 16-aligned as
    // a call needs), rbp, rbx, r12 = f, r13 = the entry, r14, r15, and the
    // control words of this thread.
    uint64_t* top = (uint64_t*)(((uintptr_t)(stack + size) & ~(uintptr_t)15)
                                - 24);
    top[0] = (uint64_t)(uintptr_t)emu_fiber_start;
    top[-1] = top[-2] = top[-5] = top[-6] = 0;
    top[-3] = (uint64_t)(uintptr_t)f;
    top[-4] = (uint64_t)(uintptr_t)emu_fiber_main;
    uint32_t* words = (uint32_t*)(top - 7);
    uint16_t x87;
    asm volatile("stmxcsr %0" : "=m"(words[0]));
    asm volatile("fnstcw %0" : "=m"(x87));
    words[1] = x87;
    c->sp = top - 7;
#else
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = nullptr;
    uintptr_t p = (uintptr_t)f;
    makecontext(&c->uc, (void (*)())emu_fiber_main_words, 2,
                (unsigned int)(p & 0xffffffffu), (unsigned int)(p >> 32));
#endif
}

// A thread of a block: a fiber with its own stack, run by a worker.
struct emu_fiber {
    emu_context context;
    emu_dim3 thread;
    emu_dim3 block;
    char* stack = nullptr;  // EMU_STACK bytes, a guard page at the bottom
    long waiting = -1;  // the barrier phase it waits to see end, or -1
    bool done = true;   // finished the current launch
    emu_worker* worker = nullptr;
    int index = 0;      // the thread's index in its block
};

// The threads of blocks of one size, kept between launches: one worker (an
// OS thread) per EMU_FIBERS_PER_THREAD of them, which runs its fibers in
// turn, each until it waits at a barrier, leaves the kernel, or is
// preempted.
struct emu_pool;

struct emu_worker {
    emu_pool* pool = nullptr;
    emu_context home;
    std::vector<emu_fiber*> fibers;
    emu_fiber* current = nullptr;
    // Set only while a fiber runs kernel code: the preemption signal is
    // ignored elsewhere (in the scheduler and the barrier).
    volatile sig_atomic_t preemptible = 0;
    std::atomic<unsigned long> switches{0};
    pthread_t thread{};
    std::atomic<bool> started{false};

    void schedule();
};

// The monitor: one thread, started with the first pool, that preempts a
// fiber running for over EMU_SLICE_MS and releases the waiters of a launch
// running for over EMU_TIMEOUT_MS.
struct emu_monitor {
    std::mutex mutex;
    std::condition_variable cv;
    std::vector<emu_worker*>* workers = nullptr;  // of the running launch
    unsigned long launch = 0;                      // counts the launches
    std::chrono::steady_clock::time_point deadline;

    void watch(std::vector<emu_worker*>* w, int timeout_ms) {
        std::lock_guard<std::mutex> lock(mutex);
        workers = w;
        ++launch;
        deadline = std::chrono::steady_clock::now()
                   + std::chrono::milliseconds(timeout_ms);
        cv.notify_one();
    }

    void stop() {
        std::lock_guard<std::mutex> lock(mutex);
        workers = nullptr;
    }

    void loop();
};

// Never destroyed: its thread waits on it until the process ends.
static emu_monitor& emu_the_monitor = *new emu_monitor;
static struct sigaction emu_previous_action;

static void emu_preempt(int sig, siginfo_t* info, void* context) {
    emu_worker* w = emu_self;
    if (w == nullptr) {
        // Another module's worker: its handler was installed before ours.
        if (emu_previous_action.sa_flags & SA_SIGINFO) {
            if (emu_previous_action.sa_sigaction != nullptr) {
                emu_previous_action.sa_sigaction(sig, info, context);
            }
        } else if (emu_previous_action.sa_handler != SIG_DFL
                   && emu_previous_action.sa_handler != SIG_IGN) {
            emu_previous_action.sa_handler(sig);
        }
        return;
    }
    // The signal is not blocked in its handler (SA_NODEFER: the scheduler
    // the handler switches to must stay preemptible), so one arriving here
    // finds preemptible already 0.
    if (!__atomic_exchange_n(&w->preemptible, 0, __ATOMIC_SEQ_CST)) {
        return;
    }
    if (w->current == nullptr) {
        w->preemptible = 1;
        return;
    }
    int saved = errno;
    emu_fiber* f = w->current;
    // To the scheduler; this fiber stays runnable and resumes here.
    emu_switch(&f->context, &w->home);
    w->preemptible = 1;
    errno = saved;
}

void emu_monitor::loop() {
    std::vector<unsigned long> seen;
    unsigned long watching = 0;
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
        cv.wait(lock, [&]() {
            return workers != nullptr && launch != watching;
        });
        watching = launch;
        std::vector<emu_worker*>& w = *workers;
        seen.assign(w.size(), ~0ul);
        bool timed_out = false;
        for (;;) {
            cv.wait_for(lock, std::chrono::milliseconds(EMU_SLICE_MS));
            if (workers == nullptr || launch != watching) {
                break;
            }
            for (size_t k = 0; k < w.size(); ++k) {
                unsigned long n = w[k]->switches.load();
                if (n == seen[k] && w[k]->preemptible) {
                    pthread_kill(w[k]->thread, SIGURG);
                }
                seen[k] = n;
            }
            if (!timed_out && std::chrono::steady_clock::now() > deadline) {
                timed_out = true;
                emu_block_barrier.failed.store(2);
                emu_block_barrier.phase.fetch_add(1);
                emu_block_barrier.phase.notify_all();
            }
        }
    }
}

void emu_barrier::arrive(bool at_exit) {
    emu_worker* w = emu_self;
    w->preemptible = 0;
    if (failed.load(std::memory_order_acquire)) {
        w->preemptible = 1;
        return;
    }
    long my_phase = phase.load(std::memory_order_acquire);
    if (at_exit) {
        exited.fetch_add(1, std::memory_order_acq_rel);
    }
    if (arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == size) {
        int e = exited.exchange(0, std::memory_order_acq_rel);
        if (e != 0 && e != size) {
            failed.store(1, std::memory_order_release);
        }
        arrived.store(0, std::memory_order_release);
        phase.fetch_add(1, std::memory_order_acq_rel);
        phase.notify_all();
        w->preemptible = 1;
        return;
    }
    // The scheduler runs the worker's other threads, and resumes this one
    // once the phase has moved on (the monitor moves it on to free the
    // waiters of a deadlocked launch).
    w->current->waiting = my_phase;
    emu_switch(&w->current->context, &w->home);
    w->preemptible = 1;
}

struct emu_pool {
    int size;
    std::vector<emu_worker*> workers;
    std::atomic<long> generation{0};
    std::atomic<int> finished{0};
    const std::function<void()>* body = nullptr;

    explicit emu_pool(int n) : size(n) {
        static bool installed = false;
        if (!installed) {
            installed = true;
            struct sigaction action;
            std::memset(&action, 0, sizeof action);
            action.sa_sigaction = emu_preempt;
            action.sa_flags = SA_SIGINFO | SA_RESTART | SA_NODEFER;
            sigemptyset(&action.sa_mask);
            sigaction(SIGURG, &action, &emu_previous_action);
            std::thread([]() { emu_the_monitor.loop(); }).detach();
        }
        const int per = EMU_FIBERS_PER_THREAD;
        const int nworkers = (n + per - 1) / per;
        for (int k = 0; k < nworkers; ++k) {
            emu_worker* w = new emu_worker;
            w->pool = this;
            for (int t = k * per; t < n && t < (k + 1) * per; ++t) {
                emu_fiber* f = new emu_fiber;
                f->worker = w;
                f->index = t;
                char* stack = (char*)mmap(
                    nullptr, EMU_STACK, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
                if (stack == MAP_FAILED) {
                    std::perror("cuda_emulator: mmap of a thread's stack");
                    std::abort();
                }
                // A guard page below the stack.
                mprotect(stack, 4096, PROT_NONE);
                f->stack = stack;
                emu_context_make(&f->context, stack, EMU_STACK, f);
                w->fibers.push_back(f);
            }
            workers.push_back(w);
        }
        for (emu_worker* w : workers) {
            // Detached: the pool lives as long as the process.
            std::thread([this, w]() { work(w); }).detach();
        }
        for (emu_worker* w : workers) {
            while (!w->started.load()) {
                std::this_thread::yield();
            }
        }
    }

    void work(emu_worker* w) {
        emu_self = w;
        w->thread = pthread_self();
        w->started.store(true);
        long seen = 0;
        for (;;) {
            generation.wait(seen, std::memory_order_acquire);
            seen = generation.load(std::memory_order_acquire);
            for (emu_fiber* f : w->fibers) {
                f->thread.x = f->index % blockDim.x;
                f->thread.y = (f->index / blockDim.x) % blockDim.y;
                f->thread.z = f->index / (blockDim.x * blockDim.y);
                f->done = false;
                f->waiting = -1;
            }
            w->schedule();
            if (finished.fetch_add(1, std::memory_order_acq_rel) + 1
                    == (int)workers.size()) {
                finished.notify_all();
            }
        }
    }

    void run(const std::function<void()>& f, int timeout_ms) {
        body = &f;
        finished.store(0, std::memory_order_release);
        emu_the_monitor.watch(&workers, timeout_ms);
        generation.fetch_add(1, std::memory_order_acq_rel);
        generation.notify_all();
        int done;
        while ((done = finished.load(std::memory_order_acquire))
               != (int)workers.size()) {
            finished.wait(done, std::memory_order_acquire);
        }
        emu_the_monitor.stop();
    }
};

// A fiber: runs the kernel for its thread in every block of each launch.
static void emu_fiber_main(emu_fiber* f) {
    for (;;) {
        f->worker->preemptible = 1;
        emu_pool* pool = f->worker->pool;
        for (unsigned int z = 0; z < gridDim.z; ++z) {
            for (unsigned int y = 0; y < gridDim.y; ++y) {
                for (unsigned int x = 0; x < gridDim.x; ++x) {
                    f->block.x = blockIdx.x = x;
                    f->block.y = blockIdx.y = y;
                    f->block.z = blockIdx.z = z;
                    (*pool->body)();
                    // No thread starts the next block (whose shared
                    // memory is the same) before all have left this one.
                    emu_block_barrier.arrive(true);
                    if (emu_block_barrier.failed.load()) {
                        z = gridDim.z;
                        y = gridDim.y;
                        break;
                    }
                }
            }
        }
        f->worker->preemptible = 0;
        f->done = true;
        emu_switch(&f->context, &f->worker->home);
    }
}

// Runs the worker's fibers in turn until all have finished the launch; a
// fiber waiting at a barrier is skipped until the barrier's phase moves on,
// and when all wait, so does the worker. Once the launch has timed out, a
// fiber still in the kernel is abandoned (it may spin forever): its context
// is made anew, to start the next launch from the top.
void emu_worker::schedule() {
    for (;;) {
        bool ran = false, live = false;
        long waited = 0;
        for (emu_fiber* f : fibers) {
            if (f->done) {
                continue;
            }
            if (emu_block_barrier.failed.load() == 2) {
                emu_context_make(&f->context, f->stack, EMU_STACK, f);
                f->done = true;
                continue;
            }
            live = true;
            if (f->waiting >= 0) {
                long p = emu_block_barrier.phase.load(
                    std::memory_order_acquire);
                if (p == f->waiting) {
                    waited = p;
                    continue;
                }
                f->waiting = -1;
            }
            current = f;
            threadIdx = f->thread;
            blockIdx = f->block;
            switches.fetch_add(1, std::memory_order_relaxed);
            emu_switch(&home, &f->context);
            current = nullptr;
            ran = true;
        }
        if (!live) {
            return;
        }
        if (!ran) {
            emu_block_barrier.phase.wait(waited, std::memory_order_acquire);
        }
    }
}

// Runs body() for every thread of every block of the grid; returns 0, or 1
// with the reason in emu_last_error(). One launch at a time.
static int emu_run(const unsigned int* grid, const unsigned int* block,
                   const std::function<void()>& body) {
    static std::mutex launch_mutex;
    static emu_pool* pools[1025] = {};
    std::lock_guard<std::mutex> launch_lock(launch_mutex);
    gridDim.x = grid[0];
    gridDim.y = grid[1];
    gridDim.z = grid[2];
    blockDim.x = block[0];
    blockDim.y = block[1];
    blockDim.z = block[2];
    const int nthreads = (int)(block[0] * block[1] * block[2]);
    emu_block_barrier.reset(nthreads);
    emu_error[0] = '\0';
    if (pools[nthreads] == nullptr) {
        pools[nthreads] = new emu_pool(nthreads);
    }
    const int timeout_ms = emu_timeout_ms.load();
    pools[nthreads]->run(body, timeout_ms);
    int failed = emu_block_barrier.failed.load();
    if (failed == 1) {
        std::snprintf(emu_error, sizeof emu_error,
                      "divergent __syncthreads(): some threads of a block "
                      "waited at a barrier that others never reached");
    } else if (failed == 2) {
        std::snprintf(emu_error, sizeof emu_error,
                      "the launch ran for over %d ms: threads waiting at "
                      "__syncthreads() were released and threads still "
                      "running abandoned (a deadlock, or a loop that never "
                      "ends?)", timeout_ms);
    }
    return failed ? 1 : 0;
}

}  // namespace
