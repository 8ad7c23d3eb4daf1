// The CPU thread count of a gtron process when OMP_NUM_THREADS is unset.
//
// Rule (measured, docs/cli.md "CPU threads"): the physical cores this process may run on (its
// CPU affinity, hyper-thread siblings counted once) divided by the processes of the job on this
// node (LOCAL_WORLD_SIZE, default 1), capped at 8 (the CPU kernels stop scaling there); and 1 when
// that leaves fewer than 4 cores: on a small machine OpenMP's spinning workers fight every other
// process for the same cores (tiny.json ran several times slower with 2 threads than with 1 on a
// busy 2-core machine). An OMP_NUM_THREADS the user sets is always kept.
#pragma once

namespace gtron {

// The threads the rule above gives for `physical_cores` and `local_processes` (both >= 1).
int default_cpu_threads(int physical_cores, int local_processes);

// When OMP_NUM_THREADS is unset: applies default_cpu_threads() of this machine through
// omp_set_num_threads() and exports OMP_NUM_THREADS for child processes. Returns the count in
// force (OpenMP's own when the variable was set).
int apply_default_cpu_threads();

}  // namespace gtron
