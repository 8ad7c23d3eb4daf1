// One rank of the launcher test: reads the torchrun environment, meets the other ranks at the
// store, builds the Gloo grid (gtp = argv[2]) and writes what it saw to DIR/rank_<R>.txt:
//   "rank world local_rank local_world group_rank world_sum gtp_members dp_members"
// where world_sum is an all_reduce of rank + 1 and the member lists come from all_gathers.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "model/check.h"
#include "parallel/gloo_communicator.h"
#include "parallel/store.h"

namespace gtron::parallel {
namespace {

std::string gather_ranks(Communicator& comm, int world_rank) {
  Tensor me = Tensor::from_vector({1.0 * world_rank}, {1}, DType::kF32);
  Tensor all = Tensor::zeros({comm.size()}, DType::kF32);
  comm.all_gather(me, all).synchronize();
  std::string s;
  for (double r : all.to_vector()) s += (s.empty() ? "" : ",") + std::to_string(int(r));
  return s;
}

int run(const std::string& dir, int gtp) {
  const DistEnv env = dist_env_from_environment();
  const std::chrono::seconds timeout(20);
  Rendezvous rv = rendezvous(env, timeout, timeout);
  GlooOptions options;
  options.timeout = timeout;
  Grid grid = make_gloo_grid(*rv.client, env.rank, env.world_size, gtp, 1, options);
  Tensor x = Tensor::from_vector({env.rank + 1.0}, {1}, DType::kF64);
  grid.world->all_reduce(x).synchronize();
  const std::string gtp_members = gather_ranks(*grid.gtp, env.rank);
  const std::string dp_members = gather_ranks(*grid.dp, env.rank);
  // Nobody leaves (rank 0 would take the store with it) before everyone is done.
  grid.world->barrier();
  std::ofstream out(dir + "/rank_" + std::to_string(env.rank) + ".txt");
  out << env.rank << " " << env.world_size << " " << env.local_rank << " " << env.local_world_size
      << " " << env.group_rank << " " << x.item() << " " << gtp_members << " " << dp_members
      << "\n";
  return out.good() ? 0 : 1;
}

}  // namespace
}  // namespace gtron::parallel

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: dist_worker OUT_DIR GTP\n");
    return 2;
  }
  try {
    return gtron::parallel::run(argv[1], std::atoi(argv[2]));
  } catch (const gtron::UserError& e) {
    std::fprintf(stderr, "dist_worker: %s\n", e.what());
    return 2;
  }
}
