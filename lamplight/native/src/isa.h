// The instruction set a build's kernels use: each library variant (build.py) is compiled with
// its own flags, and these macros say which SIMD paths that build takes.
#pragma once

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define LP_ISA_AVX512VNNI 1
#include <immintrin.h>
#elif defined(__AVX2__)
#define LP_ISA_AVX2 1
#include <immintrin.h>
#endif
