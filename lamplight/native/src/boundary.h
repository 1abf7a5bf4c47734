/* The C boundary: the error codes the entry points return, the message of the last failure, and
the guard that keeps C++ exceptions inside the library (one escaping an extern "C" function into
Python's ctypes call would abort the whole process). lamplight/native/abi.py mirrors the codes
and turns each into a Python exception. */
#ifndef LAMPLIGHT_BOUNDARY_H
#define LAMPLIGHT_BOUNDARY_H

#include <stdint.h>

#ifdef __cplusplus
#include <exception>
#include <new>

extern "C" {
#endif

enum {
    LP_OK = 0,
    LP_ERR_UNSUPPORTED = 1,   /* shapes the native forward does not handle */
    LP_ERR_POSITION = 2,      /* positions[r] outside the RoPE tables */
    LP_ERR_WRITE_SLOT = 3,    /* write_slots[r] outside the pool */
    LP_ERR_KEY_OFFSET = 4,    /* key_offsets[r] negative, or a key it reads past key_slots */
    LP_ERR_KEY_SLOT = 5,      /* a key slot outside the pool */
    LP_ERR_LOGIT_ROW = 6,     /* logit_rows[i] outside [0, n_rows) */
    LP_ERR_LORA_ADAPTER = 7,  /* an adapter index past lora_scales */
    LP_ERR_ARGUMENT = 8,      /* a count, range, pointer or format the function does not take */
    LP_ERR_MODEL = 9,         /* lp_model_new: a description the forward cannot run */
    LP_ERR_NO_MEMORY = 10,    /* std::bad_alloc: a scratch buffer could not grow */
    LP_ERR_INTERNAL = 11      /* any other C++ exception */
};

/* The code of this thread's last failure (LP_OK if none yet) and, in *message if not null, what
it was (which array, row and value); the message stays valid until the thread's next failure. */
int32_t lp_last_error(const char** message);
/* Pool tasks that throw, for the tests of this boundary (see boundary.cpp). */
int32_t lp_selftest_throw(int32_t n_tasks, int32_t kind);

#ifdef __cplusplus
}

namespace lp {

// Record this thread's failure for lp_last_error (printf-style message); returns code.
int32_t fail(int32_t code, const char* format, ...) __attribute__((format(printf, 2, 3)));
int32_t fail_exception(const std::exception_ptr& error);

// body() (returning an LP_* code) with every exception turned into a code and a message: the
// body of each entry point that can throw (allocations, the thread pool).
template <class F>
int32_t guarded(F&& body) noexcept {
    try {
        return body();
    } catch (...) {
        return fail_exception(std::current_exception());
    }
}

}  // namespace lp
#endif

#endif
