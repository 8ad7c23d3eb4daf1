#include "trainer/threads.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <utility>

namespace gtron {
namespace {

// Physical cores among the CPUs this process may use: (package, core) pairs from sysfs, so two
// hyper-threads of one core count once. Falls back to the CPU count where sysfs is missing.
int physical_cores_available() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  std::set<std::pair<int, int>> cores;
  int cpus = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    ++cpus;
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    int package = -1, core = -1;
    std::ifstream p(base + "physical_package_id"), c(base + "core_id");
    if (!(p >> package) || !(c >> core)) {
      package = -1;
      core = cpu;  // unknown topology: each CPU a core
    }
    cores.insert({package, core});
  }
  return std::max<int>(1, cores.empty() ? cpus : static_cast<int>(cores.size()));
}

}  // namespace

int default_cpu_threads(int physical_cores, int local_processes) {
  const int per_process = std::max(1, physical_cores / std::max(1, local_processes));
  if (per_process < 4) return 1;
  return std::min(per_process, 8);
}

int apply_default_cpu_threads() {
  const char* set = std::getenv("OMP_NUM_THREADS");
  if (set != nullptr && *set != '\0') return omp_get_max_threads();
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  const int procs = local != nullptr ? std::max(1, std::atoi(local)) : 1;
  const int n = default_cpu_threads(physical_cores_available(), procs);
  omp_set_num_threads(n);
  setenv("OMP_NUM_THREADS", std::to_string(n).c_str(), /*overwrite=*/0);
  return n;
}

}  // namespace gtron
