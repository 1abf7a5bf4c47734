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

// The XOR of every cache line of [p, p + bytes) (whole lines), read as `streams` interleaved
// streams: the range's equal parts, kPiece bytes of each in turn (a remainder of under
// streams * kPiece bytes goes last, alone). A line is a vector of the build's width (GCC's vector
// extension: one AVX-512 register, two AVX2 ones, ...): read as 64-bit words, GCC 12 kept the
// interleaved loop scalar, and its loads capped one stream at 19 GB/s against 27 on 2 cores.
// The result is kept so the reads cannot be dropped.
constexpr int64_t kPiece = 256;
typedef uint64_t Line __attribute__((vector_size(64)));

inline void xor_lines(Line& acc, const uint8_t* p, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i += 64) {
        Line line;
        std::memcpy(&line, p + i, 64);
        acc ^= line;
    }
}

uint64_t fold(const uint8_t* p, int64_t bytes, int streams) {
    Line acc = {0, 0, 0, 0, 0, 0, 0, 0};
    const int64_t part = bytes / (streams * kPiece) * kPiece;  // each stream's bytes
    for (int64_t at = 0; at < part; at += kPiece)
        for (int s = 0; s < streams; ++s) xor_lines(acc, p + s * part + at, kPiece);
    xor_lines(acc, p + streams * part, bytes - streams * part);
    return acc[0] ^ acc[1] ^ acc[2] ^ acc[3] ^ acc[4] ^ acc[5] ^ acc[6] ^ acc[7];
}

// The read patterns timed: one stream a task, and kStreams side by side, as decode rows may read
// their weights (qmatmul.cpp's side-by-side groups). On an Intel Xeon (family 6 model 167), 512
// MiB on 2 threads: one stream 27.3-27.9 GB/s, 4 side by side 31.3-32.1 (one stream as 64-bit
// words, the probe before: 26.1-26.9); the roofline is the faster.
constexpr int kStreams = 4;

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
    auto* bytes_of = static_cast<const uint8_t*>(buffer.get());
    std::memset(buffer.get(), 0x5A, size_t(total));  // every page present before the first timed pass
    double best = 0.0;
    uint64_t folded[kTasks];
    const int32_t status = lp::guarded([&] {
        for (int32_t pass = 0; pass < passes; ++pass)
            for (int streams : {1, kStreams}) {  // alternated, so both see the same moments
                const auto start = std::chrono::steady_clock::now();
                lp::parallel_for(kTasks, [&](int64_t task, int) {
                    folded[task] = fold(bytes_of + task * share, share, streams);
                });
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
