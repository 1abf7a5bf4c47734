// A small persistent thread pool for the native forward pass.
//
// Each parallel phase is a set of independent tasks claimed one at a time from a shared
// counter. The calling thread works too, and a phase ends when every task is *done*, not when
// every worker has arrived: a worker the OS has descheduled (a loaded machine) claims nothing
// and delays nothing. Workers spin briefly between the phases of a step and sleep as soon as
// the step ends (pool_park), so they never compete for the cores while Python samples.
#pragma once
#include <cstdint>
#include <functional>

namespace lp {

using TaskFn = std::function<void(int64_t task, int thread)>;

// Total threads including the caller (>= 1); throws std::system_error if the OS gives fewer
// (pool_threads() then says how many run).
void pool_set_threads(int n);
int pool_threads();
// Run fn(task, thread) for task in [0, n_tasks); returns when all are done. If tasks threw, the
// first exception is rethrown here, on the calling thread, once every task has finished (one
// escaping a worker thread would terminate the process).
void parallel_for(int64_t n_tasks, const TaskFn& fn);
// The step is over: workers sleep now rather than spin (until the next parallel_for).
void pool_park();

}  // namespace lp
