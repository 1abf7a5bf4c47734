// The host's memory read bandwidth, as the pool's threads read it: the figure a single decode
// stream is judged against (lamplight bench's roofline), since one row of decoding reads every
// weight once and does little else.
#include "bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "boundary.h"
#include "pool.h"

namespace {

// Tasks a pass is cut into: enough that a thread the OS delays leaves its share to the others.
constexpr int64_t kTasks = 64;
constexpr int64_t kLine = 64;

// The XOR of every 64-bit word of [p, p + bytes): eight independent lanes, which the compiler
// turns into full-width vector loads; the result is kept so the reads cannot be dropped.
uint64_t fold(const uint64_t* p, int64_t bytes) {
    uint64_t lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const int64_t words = bytes / 8;
    for (int64_t i = 0; i < words; i += 8)
        for (int l = 0; l < 8; ++l) lane[l] ^= p[i + l];
    return lane[0] ^ lane[1] ^ lane[2] ^ lane[3] ^ lane[4] ^ lane[5] ^ lane[6] ^ lane[7];
}

volatile uint64_t sink;

struct FreeDeleter {
    void operator()(void* p) const { std::free(p); }
};

}  // namespace

extern "C" {

double lp_read_bandwidth(int64_t bytes, int32_t passes) {
    if (bytes < kTasks * kLine || passes < 1) {
        lp::fail(LP_ERR_ARGUMENT, "lp_read_bandwidth: bytes %lld (at least %lld) or passes %d (at least 1)",
                 (long long)bytes, (long long)(kTasks * kLine), passes);
        return -1.0;
    }
    const int64_t share = bytes / kTasks / kLine * kLine;  // whole lines per task
    const int64_t total = share * kTasks;
    std::unique_ptr<void, FreeDeleter> buffer(std::aligned_alloc(kLine, size_t(total)));
    if (!buffer) {
        lp::fail(LP_ERR_NO_MEMORY, "lp_read_bandwidth: cannot allocate %lld bytes", (long long)total);
        return -1.0;
    }
    auto* words = static_cast<uint64_t*>(buffer.get());
    std::memset(words, 0x5A, size_t(total));  // every page present before the first timed pass
    double best = 0.0;
    uint64_t folded[kTasks];
    const int32_t status = lp::guarded([&] {
        for (int32_t pass = 0; pass < passes; ++pass) {
            const auto start = std::chrono::steady_clock::now();
            lp::parallel_for(kTasks, [&](int64_t task, int) { folded[task] = fold(words + task * share / 8, share); });
            const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            if (seconds > 0) best = std::max(best, double(total) / seconds / 1e9);
        }
        lp::pool_park();
        return (int32_t)LP_OK;
    });
    sink = folded[0];  // the reads' result is used, so the compiler keeps them
    return status == LP_OK ? best : -1.0;
}

}  // extern "C"
