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

void set_expert_layout(GridLayout& l, int ep) {
  if (ep < 1 || l.data_size % ep != 0) {
    throw UserError(str_cat("parallel ep = ", ep, " does not divide the ", l.data_size,
                            " data ranks (world size / tp). Hint: choose an ep among their "
                            "divisors"));
  }
  const int tp = l.tp_size;
  l.ep_size = ep;
  l.ep_rank = l.data_rank % ep;
  l.ep_group = (l.data_rank / ep) * tp + l.tp_rank;
  l.expert_data_size = l.data_size / ep;
  l.expert_data_rank = l.data_rank / ep;
  l.expert_data_group = l.ep_rank * tp + l.tp_rank;
  l.ep_members.clear();
  l.expert_data_members.clear();
  for (int i = 0; i < ep; ++i)
    l.ep_members.push_back(((l.data_rank / ep) * ep + i) * tp + l.tp_rank);
  for (int j = 0; j < l.expert_data_size; ++j)
    l.expert_data_members.push_back((j * ep + l.ep_rank) * tp + l.tp_rank);
}

void add_expert_groups(Grid& grid, StoreClient& store, int ep, const CommunicatorFactory& make,
                       const std::string& prefix) {
  set_expert_layout(grid.layout, ep);
  if (ep == 1) return;
  const GridLayout& l = grid.layout;
  grid.ep = make(store, str_cat(prefix, "/ep", l.ep_group), l.ep_rank, l.ep_size);
  grid.expert_data = make(store, str_cat(prefix, "/edp", l.expert_data_group), l.expert_data_rank,
                          l.expert_data_size);
}

}  // namespace gtron::parallel
