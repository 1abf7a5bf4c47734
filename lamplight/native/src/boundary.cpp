#include "boundary.h"

#include <cstdarg>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "pool.h"

namespace {

// Per thread: a step's failure is read back by the thread that called into the library (the
// engine thread), whatever another thread's calls do meanwhile.
thread_local int32_t last_code = LP_OK;
thread_local char last_message[512] = "";

}  // namespace

namespace lp {

int32_t fail(int32_t code, const char* format, ...) {
    va_list args;
    va_start(args, format);
    std::vsnprintf(last_message, sizeof last_message, format, args);
    va_end(args);
    last_code = code;
    return code;
}

int32_t fail_exception(const std::exception_ptr& error) {
    try {
        std::rethrow_exception(error);
    } catch (const std::bad_alloc& e) {
        return fail(LP_ERR_NO_MEMORY, "out of memory in the native kernels (%s)", e.what());
    } catch (const std::exception& e) {
        return fail(LP_ERR_INTERNAL, "C++ exception in the native kernels: %s", e.what());
    } catch (...) {
        return fail(LP_ERR_INTERNAL, "unknown C++ exception in the native kernels");
    }
}

}  // namespace lp

extern "C" {

int32_t lp_last_error(const char** message) {
    if (message) *message = last_message;
    return last_code;
}

// A test of this boundary (tests/test_native_boundary.py): n_tasks pool tasks, the odd ones
// throwing (kind 0: std::bad_alloc, 1: std::runtime_error, else a non-std exception), on
// whichever threads run them; returns the guarded code, as the forward's entry points do.
int32_t lp_selftest_throw(int32_t n_tasks, int32_t kind) {
    return lp::guarded([&] {
        lp::parallel_for(n_tasks, [&](int64_t task, int) {
            if (task % 2 == 0) return;
            if (kind == 0) throw std::bad_alloc();
            if (kind == 1) throw std::runtime_error("selftest task " + std::to_string(task));
            throw 42;
        });
        lp::pool_park();
        return (int32_t)LP_OK;
    });
}

}  // extern "C"
