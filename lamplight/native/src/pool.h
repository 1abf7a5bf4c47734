// A small persistent thread pool for the native forward pass.
//
// Each parallel phase is a set of independent tasks claimed one at a time from a shared
// counter. The calling thread works too, and a phase ends when every task is *done*, not when
// every worker has arrived: a worker the OS has descheduled (a loaded machine) claims nothing
// and delays nothing. Workers spin briefly between phases of a step and sleep between steps,
// so they do not steal the cores from PyTorch's own threads while Python samples.
#pragma once
#include <cstdint>
#include <functional>

namespace lp {

using TaskFn = std::function<void(int64_t task, int thread)>;

void pool_set_threads(int n);  // total threads including the caller (>= 1)
int pool_threads();
// Run fn(task, thread) for task in [0, n_tasks); returns when all are done.
void parallel_for(int64_t n_tasks, const TaskFn& fn);

}  // namespace lp
