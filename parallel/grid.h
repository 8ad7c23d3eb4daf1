// The process-group grid: World = DP x GTP x TP, built identically on every rank.
//
// Layout policy (every rank computes it alone, from its rank, the world size, G = gtp and TP):
// rank = (dp_rank * G + gtp_rank) * TP + tp_rank, TP the most local axis.
// - TP group t holds the consecutive ranks [t * TP, (t + 1) * TP); a rank's TP rank is rank % TP.
//   Consecutive ranks share a node under gtronrun, so the chattiest group (an all-reduce per
//   layer) stays local. TP peers train on the same micro-batches.
// - GTP group: the ranks of one DP rank and one TP rank, ascending (stride TP). At TP = 1 it holds
//   the consecutive ranks [g * G, (g + 1) * G).
// - DP group: the ranks of one GTP rank and one TP rank, ascending (stride G * TP).
// - Data group (TP > 1 only): the DP x GTP ranks of one TP rank (stride TP): the ranks that see
//   different data, over which the whole (unsharded) parameters reduce. At TP = 1 it is the world.
// - Communicators are created world first, then GTP, then DP, then (TP > 1) TP and data, each from
//   its own store key prefix ("<prefix>/world", "<prefix>/gtp<g>", "<prefix>/dp<j>",
//   "<prefix>/tp<t>", "<prefix>/data<j>"). Each creation waits only for members of that group, who
//   all come from the same earlier step, so creation never deadlocks.
//
// Note [expert-parallel groups]
// Expert parallelism (EP, add_expert_groups) is a sub-axis of the data ranks, as in Megatron-LM
// and DeepSeek-V3: dense weights stay replicated over the data group, and only the routed experts
// are cut. With data rank d = world_rank / TP and EP dividing data_size:
// - EP group: the EP consecutive data ranks of one TP rank, [⌊d/EP⌋·EP, ⌊d/EP⌋·EP + EP); a rank's
//   EP rank is d % EP. Its members exchange routed tokens (all_to_all): EP rank e holds the
//   experts [e·E/EP, (e + 1)·E/EP) of every MoE layer.
// - Expert-data group: the data ranks of one TP rank with the same EP rank (stride EP), data_size /
//   EP of them: the ranks that hold the same experts, over which the experts' gradients reduce.
// Created after the grid's groups, EP first, then expert-data ("<prefix>/ep<g>",
// "<prefix>/edp<j>"), EP > 1 only. Under GTP, EP = 2 makes an EP group of the two ranks of a GTP
// group (consecutive data ranks): they talk over two communicators, one per job.
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
  int gtp_size = 1;               // G
  int dp_size = 1;                // world_size / (G * TP)
  int gtp_group = 0;              // dp_rank * TP + tp_rank (world_rank / G at TP = 1)
  int gtp_rank = 0;               // data_rank % G
  int dp_group = 0;               // gtp_rank * TP + tp_rank (world_rank % G at TP = 1)
  int dp_rank = 0;                // data_rank / G
  int tp_size = 1;                // TP
  int tp_group = 0;               // world_rank / TP
  int tp_rank = 0;                // world_rank % TP
  int data_size = 1;              // world_size / TP: ranks that see different data
  int data_rank = 0;              // world_rank / TP
  std::vector<int> gtp_members;   // world ranks of this rank's GTP group, ascending
  std::vector<int> dp_members;    // world ranks of this rank's DP group, ascending
  std::vector<int> tp_members;    // world ranks of this rank's TP group, ascending
  std::vector<int> data_members;  // world ranks of this rank's data group, ascending
  // Note [expert-parallel groups] (add_expert_groups; EP = 1 otherwise).
  int ep_size = 1;                       // EP
  int ep_rank = 0;                       // data_rank % EP
  int ep_group = 0;                      // (data_rank / EP) * TP + tp_rank
  int expert_data_size = 1;              // data_size / EP
  int expert_data_rank = 0;              // data_rank / EP
  int expert_data_group = 0;             // ep_rank * TP + tp_rank
  std::vector<int> ep_members;           // world ranks of this rank's EP group, ascending
  std::vector<int> expert_data_members;  // world ranks of its expert-data group, ascending
};

// Throws UserError unless 1 <= gtp, 1 <= tp and gtp * tp divides world_size.
GridLayout grid_layout(int world_rank, int world_size, int gtp, int tp = 1);
// Sets the EP fields of `l` (Note [expert-parallel groups]). Throws UserError unless 1 <= ep and
// ep divides l.data_size.
void set_expert_layout(GridLayout& l, int ep);

struct Grid {
  GridLayout layout;
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> dp;
  std::unique_ptr<Communicator> gtp;
  std::unique_ptr<Communicator> tp;           // TP > 1 only
  std::unique_ptr<Communicator> data;         // TP > 1 only (at TP = 1 the data group is the world)
  std::unique_ptr<Communicator> ep;           // EP > 1 only (add_expert_groups)
  std::unique_ptr<Communicator> expert_data;  // EP > 1 only
  // The group whole parameters reduce over: `data`, or the world at TP = 1.
  Communicator* data_group() const { return data ? data.get() : world.get(); }
};

// Creates one communicator of `size` ranks, this process being `rank`, bootstrapped through
// `store` under the key prefix `name` (unique per store).
using CommunicatorFactory = std::function<std::unique_ptr<Communicator>(
    StoreClient& store, const std::string& name, int rank, int size)>;

// Builds the grid with `make`. Collective over the world: every rank calls it, with the same
// `world_size`, `gtp`, `tp` and `prefix` (unique per store: a second grid needs another prefix).
Grid make_grid(StoreClient& store, int world_rank, int world_size, int gtp, int tp,
               const CommunicatorFactory& make, const std::string& prefix = "grid");

// Adds the EP and expert-data groups to `grid` (Note [expert-parallel groups]); nothing at ep = 1.
// Collective over the world, after make_grid with the same `make` and `prefix`.
void add_expert_groups(Grid& grid, StoreClient& store, int ep, const CommunicatorFactory& make,
                       const std::string& prefix = "grid");

}  // namespace gtron::parallel
