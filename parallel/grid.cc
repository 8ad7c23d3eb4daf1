#include "parallel/grid.h"

#include "model/check.h"

namespace gtron::parallel {

GridLayout grid_layout(int world_rank, int world_size, int gtp) {
  GTRON_CHECK(world_size >= 1 && world_rank >= 0 && world_rank < world_size, "rank ", world_rank,
              " of a world of ", world_size);
  if (gtp < 1 || world_size % gtp != 0) {
    throw UserError(str_cat("parallel gtp = ", gtp, " does not divide the world size ", world_size,
                            ". Hint: choose a gtp among the divisors of the world size "
                            "(nnodes x nproc-per-node)"));
  }
  GridLayout l;
  l.world_rank = world_rank;
  l.world_size = world_size;
  l.gtp_size = gtp;
  l.dp_size = world_size / gtp;
  l.gtp_group = world_rank / gtp;
  l.gtp_rank = world_rank % gtp;
  l.dp_group = world_rank % gtp;
  l.dp_rank = world_rank / gtp;
  for (int i = 0; i < gtp; ++i) l.gtp_members.push_back(l.gtp_group * gtp + i);
  for (int i = 0; i < l.dp_size; ++i) l.dp_members.push_back(i * gtp + l.dp_group);
  return l;
}

Grid make_grid(StoreClient& store, int world_rank, int world_size, int gtp,
               const CommunicatorFactory& make, const std::string& prefix) {
  Grid grid;
  grid.layout = grid_layout(world_rank, world_size, gtp);
  const GridLayout& l = grid.layout;
  grid.world = make(store, prefix + "/world", world_rank, world_size);
  grid.gtp = make(store, str_cat(prefix, "/gtp", l.gtp_group), l.gtp_rank, l.gtp_size);
  grid.dp = make(store, str_cat(prefix, "/dp", l.dp_group), l.dp_rank, l.dp_size);
  return grid;
}

}  // namespace gtron::parallel
