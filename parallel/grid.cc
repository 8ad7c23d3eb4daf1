#include "parallel/grid.h"

#include "model/check.h"

namespace gtron::parallel {

GridLayout grid_layout(int world_rank, int world_size, int gtp, int tp) {
  GTRON_CHECK(world_size >= 1 && world_rank >= 0 && world_rank < world_size, "rank ", world_rank,
              " of a world of ", world_size);
  if (gtp < 1 || world_size % gtp != 0) {
    throw UserError(str_cat("parallel gtp = ", gtp, " does not divide the world size ", world_size,
                            ". Hint: choose a gtp among the divisors of the world size "
                            "(nnodes x nproc-per-node)"));
  }
  if (tp < 1 || world_size % (gtp * tp) != 0) {
    throw UserError(str_cat("parallel tp = ", tp, ": gtp x tp = ", gtp * tp,
                            " does not divide the world size ", world_size,
                            ". Hint: choose gtp x tp among the divisors of the world size"));
  }
  GridLayout l;
  l.world_rank = world_rank;
  l.world_size = world_size;
  l.gtp_size = gtp;
  l.tp_size = tp;
  l.dp_size = world_size / (gtp * tp);
  l.data_size = world_size / tp;
  l.tp_rank = world_rank % tp;
  l.tp_group = world_rank / tp;
  l.data_rank = world_rank / tp;
  l.gtp_rank = l.data_rank % gtp;
  l.dp_rank = l.data_rank / gtp;
  l.gtp_group = l.dp_rank * tp + l.tp_rank;  // at TP = 1: world_rank / G
  l.dp_group = l.gtp_rank * tp + l.tp_rank;  // at TP = 1: world_rank % G
  for (int i = 0; i < gtp; ++i) l.gtp_members.push_back((l.dp_rank * gtp + i) * tp + l.tp_rank);
  for (int i = 0; i < l.dp_size; ++i) l.dp_members.push_back(i * gtp * tp + l.dp_group);
  for (int i = 0; i < tp; ++i) l.tp_members.push_back(l.tp_group * tp + i);
  for (int i = 0; i < l.data_size; ++i) l.data_members.push_back(i * tp + l.tp_rank);
  return l;
}

Grid make_grid(StoreClient& store, int world_rank, int world_size, int gtp, int tp,
               const CommunicatorFactory& make, const std::string& prefix) {
  Grid grid;
  grid.layout = grid_layout(world_rank, world_size, gtp, tp);
  const GridLayout& l = grid.layout;
  grid.world = make(store, prefix + "/world", world_rank, world_size);
  grid.gtp = make(store, str_cat(prefix, "/gtp", l.gtp_group), l.gtp_rank, l.gtp_size);
  grid.dp = make(store, str_cat(prefix, "/dp", l.dp_group), l.dp_rank, l.dp_size);
  if (tp > 1) {
    grid.tp = make(store, str_cat(prefix, "/tp", l.tp_group), l.tp_rank, l.tp_size);
    grid.data = make(store, str_cat(prefix, "/data", l.tp_rank), l.data_rank, l.data_size);
  }
  return grid;
}

}  // namespace gtron::parallel
