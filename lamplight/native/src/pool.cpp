#include "pool.h"

#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define LP_PAUSE() _mm_pause()
#else
#define LP_PAUSE() std::this_thread::yield()
#endif

namespace lp {
namespace {

// Spin iterations before a worker sleeps (a few tens of microseconds: enough to bridge the
// phases of one step, short next to the Python work between steps).
constexpr int kSpinBeforeSleep = 20000;
constexpr uint64_t kMask24 = (1u << 24) - 1;

struct Pool {
    std::vector<std::thread> workers;
    // generation (16 bits) | task count (24) | next task (24), in one word: claiming with a CAS
    // on all three means a worker that woke late never claims a task of a later phase with an
    // earlier phase's count or function.
    std::atomic<uint64_t> claim{0};
    std::atomic<int64_t> done{0};
    std::atomic<uint32_t> generation{0};
    const TaskFn* fn = nullptr;
    std::atomic<bool> stop{false};
    std::mutex mutex;
    std::condition_variable wake;
    std::atomic<int> sleepers{0};
    // Set between forward steps: workers sleep at once instead of spinning, so they leave the
    // cores to PyTorch's sampling and to other processes.
    std::atomic<bool> parked{true};
    // The first exception a task of the current phase threw (any thread), for run() to rethrow.
    std::atomic<bool> failed{false};
    std::exception_ptr error;

    ~Pool() { resize(0); }

    void resize(int n_workers) {
        stop = true;
        {
            std::lock_guard<std::mutex> lock(mutex);
            wake.notify_all();
        }
        for (auto& t : workers) t.join();
        workers.clear();
        stop = false;
        for (int i = 0; i < n_workers; i++) workers.emplace_back([this, i] { worker(i + 1); });
    }

    // Claim and run tasks of generation `gen` until none is left.
    void work(uint32_t gen, int thread) {
        for (;;) {
            uint64_t cur = claim.load(std::memory_order_acquire);
            if ((uint32_t)(cur >> 48) != (gen & 0xffff)) return;
            int64_t task = (int64_t)(cur & kMask24);
            if (task >= (int64_t)((cur >> 24) & kMask24)) return;
            if (!claim.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel)) continue;
            try {
                (*fn)(task, thread);
            } catch (...) {
                keep_first(std::current_exception());
            }
            done.fetch_add(1, std::memory_order_acq_rel);
        }
    }

    void keep_first(std::exception_ptr e) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!failed.load(std::memory_order_relaxed)) error = std::move(e);
        failed.store(true, std::memory_order_release);
    }

    // After a phase: rethrow what one of its tasks threw (the phase is over: fn is not used again).
    void rethrow_failure() {
        if (!failed.load(std::memory_order_acquire)) return;
        std::exception_ptr e;
        {
            std::lock_guard<std::mutex> lock(mutex);
            e = std::move(error);
            error = nullptr;
            failed.store(false, std::memory_order_relaxed);
        }
        std::rethrow_exception(e);
    }

    void worker(int thread) {
        uint32_t seen = generation.load();
        while (!stop.load(std::memory_order_relaxed)) {
            uint32_t gen = generation.load(std::memory_order_acquire);
            if (gen != seen) {
                seen = gen;
                work(gen, thread);
                continue;
            }
            bool moved = false;
            for (int i = 0; i < kSpinBeforeSleep && !parked.load(std::memory_order_relaxed); i++) {
                if (generation.load(std::memory_order_acquire) != seen || stop.load(std::memory_order_relaxed)) {
                    moved = true;
                    break;
                }
                LP_PAUSE();
            }
            if (moved) continue;
            std::unique_lock<std::mutex> lock(mutex);
            sleepers++;
            wake.wait(lock, [&] { return generation.load() != seen || stop.load(); });
            sleepers--;
        }
    }

    void run(int64_t count, const TaskFn& f) {
        if (workers.empty() || count <= 1 || count > (int64_t)kMask24) {
            for (int64_t t = 0; t < count; t++) f(t, 0);
            return;
        }
        fn = &f;
        parked.store(false, std::memory_order_relaxed);
        done.store(0, std::memory_order_relaxed);
        uint32_t gen = generation.load(std::memory_order_relaxed) + 1;
        claim.store((uint64_t)(gen & 0xffff) << 48 | (uint64_t)count << 24, std::memory_order_release);
        generation.store(gen, std::memory_order_release);
        if (sleepers.load() > 0) {
            std::lock_guard<std::mutex> lock(mutex);
            wake.notify_all();
        }
        work(gen, 0);
        while (done.load(std::memory_order_acquire) < count) LP_PAUSE();
        rethrow_failure();
    }
};

Pool& pool() {
    static Pool p;
    return p;
}

}  // namespace

void pool_set_threads(int n) {
    if (n < 1) n = 1;
    if ((int)pool().workers.size() != n - 1) pool().resize(n - 1);
}

int pool_threads() { return (int)pool().workers.size() + 1; }

void parallel_for(int64_t n_tasks, const TaskFn& fn) { pool().run(n_tasks, fn); }

void pool_park() { pool().parked.store(true, std::memory_order_relaxed); }

}  // namespace lp
