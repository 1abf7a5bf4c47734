// The host's memory read bandwidth (lamplight bench's single-stream roofline).
#pragma once
#include <cstdint>

extern "C" {
// GB/s (1e9 bytes a second) of the best of `passes` passes in which the pool's threads read a
// buffer of `bytes` (at least 4096; allocated and filled first, freed after), each pass once with
// every task's share read as one stream and once as 4 interleaved streams (bandwidth.cpp); -1 on
// a bad argument or a failed allocation (lp_last_error says which).
double lp_read_bandwidth(int64_t bytes, int32_t passes);
}
