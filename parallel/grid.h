// The process-group grid: World = DP x GTP, built identically on every rank.
//
// Layout policy (every rank computes it alone, from its rank, the world size and G = gtp):
// - GTP group g holds the consecutive ranks [g * G, (g + 1) * G); a rank's GTP rank is rank % G.
//   Consecutive ranks share a node under gtronrun, so the sharded (chattiest) group stays local.
// - DP group j holds the ranks with rank % G == j, ascending; a rank's DP rank is rank / G.
// - Communicators are created world first, then GTP, then DP, each from its own store key prefix
//   ("<prefix>/world", "<prefix>/gtp<g>", "<prefix>/dp<j>"). Each creation waits only for members
//   of that group, who all come from the same earlier step, so creation never deadlocks.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/store.h"

namespace gtron::parallel {

struct GridLayout {
  int world_rank = 0;
  int world_size = 1;
  int gtp_size = 1;              // G
  int dp_size = 1;               // world_size / G
  int gtp_group = 0;             // world_rank / G
  int gtp_rank = 0;              // world_rank % G
  int dp_group = 0;              // world_rank % G
  int dp_rank = 0;               // world_rank / G
  std::vector<int> gtp_members;  // world ranks of this rank's GTP group, ascending
  std::vector<int> dp_members;   // world ranks of this rank's DP group, ascending
};

// Throws UserError unless 1 <= gtp and gtp divides world_size.
GridLayout grid_layout(int world_rank, int world_size, int gtp);

struct Grid {
  GridLayout layout;
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> dp;
  std::unique_ptr<Communicator> gtp;
};

// Creates one communicator of `size` ranks, this process being `rank`, bootstrapped through
// `store` under the key prefix `name` (unique per store).
using CommunicatorFactory = std::function<std::unique_ptr<Communicator>(
    StoreClient& store, const std::string& name, int rank, int size)>;

// Builds the grid with `make`. Collective over the world: every rank calls it, with the same
// `world_size`, `gtp` and `prefix` (unique per store: a second grid needs another prefix).
Grid make_grid(StoreClient& store, int world_rank, int world_size, int gtp,
               const CommunicatorFactory& make, const std::string& prefix = "grid");

}  // namespace gtron::parallel
