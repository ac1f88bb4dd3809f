// The subset of CUDA C++ that chainer-lars's kernels use, for the host.
//
// cuda_emulator.py compiles a kernel source with the system C++ compiler
// after this header and runs its launches on the CPU:
//
// - Every thread of a block is a real thread; all of a block's threads run
//   concurrently, so a missing __syncthreads() can show up as a race.
//   Blocks run one after another on the same threads, which is one of the
//   orders a GPU may choose; __shared__ memory is one static copy, reused by
//   every block (and, as on a GPU, not cleared between blocks).
// - __syncthreads() is a barrier across all the threads of the block. A
//   barrier that some threads reach while others have left the kernel (a
//   divergent __syncthreads) is reported as an error of the launch, not a
//   hang; so is a launch still running after EMU_TIMEOUT_MS.
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
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <functional>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__ __restrict

using std::sqrt;

struct emu_dim3 {
    unsigned int x = 1, y = 1, z = 1;
};

static thread_local emu_dim3 threadIdx;
static thread_local emu_dim3 blockIdx;
static emu_dim3 blockDim;
static emu_dim3 gridDim;

#ifndef EMU_SPINS
#define EMU_SPINS 0
#endif

#ifndef EMU_TIMEOUT_MS
#define EMU_TIMEOUT_MS 60000
#endif

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
    void arrive(bool at_exit) {
        if (failed.load(std::memory_order_acquire)) {
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
            return;
        }
        // Yielding first is cheaper than sleeping when the other threads
        // are about to arrive; then a futex wait. The watchdog of emu_run
        // moves the phase on to free the waiters of a deadlocked launch.
        for (int spin = 0; spin < EMU_SPINS; ++spin) {
            if (phase.load(std::memory_order_acquire) != my_phase) {
                return;
            }
            std::this_thread::yield();
        }
        while (phase.load(std::memory_order_acquire) == my_phase) {
            phase.wait(my_phase, std::memory_order_acquire);
        }
    }
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

extern "C" const char* emu_last_error() {
    return emu_error;
}

// The threads of blocks of one size, kept between launches: starting 256
// threads costs more than most launches do.
struct emu_pool {
    int size;
    std::vector<std::thread> threads;
    std::atomic<long> generation{0};
    std::atomic<int> finished{0};
    const std::function<void()>* body = nullptr;

    explicit emu_pool(int n) : size(n) {
        for (int t = 0; t < n; ++t) {
            // Detached: the pool lives as long as the process.
            std::thread([this, t]() { work(t); }).detach();
        }
    }

    void work(int t) {
        long seen = 0;
        for (;;) {
            generation.wait(seen, std::memory_order_acquire);
            seen = generation.load(std::memory_order_acquire);
            threadIdx.x = t % blockDim.x;
            threadIdx.y = (t / blockDim.x) % blockDim.y;
            threadIdx.z = t / (blockDim.x * blockDim.y);
            for (unsigned int z = 0; z < gridDim.z; ++z) {
                for (unsigned int y = 0; y < gridDim.y; ++y) {
                    for (unsigned int x = 0; x < gridDim.x; ++x) {
                        blockIdx.x = x;
                        blockIdx.y = y;
                        blockIdx.z = z;
                        (*body)();
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
            if (finished.fetch_add(1, std::memory_order_acq_rel) + 1 == size) {
                finished.notify_all();
            }
        }
    }

    void run(const std::function<void()>& f) {
        body = &f;
        finished.store(0, std::memory_order_release);
        generation.fetch_add(1, std::memory_order_acq_rel);
        generation.notify_all();
        int done;
        while ((done = finished.load(std::memory_order_acquire)) != size) {
            finished.wait(done, std::memory_order_acquire);
        }
    }
};

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
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    std::thread watchdog([&]() {
        std::unique_lock<std::mutex> lock(mutex);
        if (!done_cv.wait_for(lock, std::chrono::milliseconds(EMU_TIMEOUT_MS),
                              [&]() { return done; })) {
            emu_block_barrier.failed.store(2);
            emu_block_barrier.phase.fetch_add(1);
            emu_block_barrier.phase.notify_all();
        }
    });
    pools[nthreads]->run(body);
    {
        std::lock_guard<std::mutex> lock(mutex);
        done = true;
    }
    done_cv.notify_one();
    watchdog.join();
    int failed = emu_block_barrier.failed.load();
    if (failed == 1) {
        std::snprintf(emu_error, sizeof emu_error,
                      "divergent __syncthreads(): some threads of a block "
                      "waited at a barrier that others never reached");
    } else if (failed == 2) {
        std::snprintf(emu_error, sizeof emu_error,
                      "the launch ran for over %d ms: threads waiting at "
                      "__syncthreads() were released (deadlock?)",
                      EMU_TIMEOUT_MS);
    }
    return failed ? 1 : 0;
}
