// Tensor parallelism (TP) in the model: how each layer is split over the TP group, and the
// slicing between a full tensor and a rank's part of it.
//
// Note [tensor-parallel layout]
// Megatron-LM's split, with TP ranks r = 0..TP−1 (consecutive world ranks, parallel/grid.h):
// - Column-parallel (output features split): attn.qkv and mlp.fc, and the MTP projection. Rank r
//   holds rows [r·n/TP, (r+1)·n/TP) of each of the weight's `groups` equal row groups (qkv has
//   three, q | k | v, so each rank holds whole heads: NH/TP of them), and the same elements of the
//   bias (the llama family's k and v groups may be replicated instead: Note [replicated
//   key/value heads]). The input passes through tp_copy (its gradient is summed over TP). The MTP
//   projection's output is gathered (tp_gather_features): the residual stream is whole on every
//   rank.
// - Row-parallel (input features split): attn.proj and mlp.proj. Rank r holds columns
//   [r·m/TP, (r+1)·m/TP) of the weight — the features its column-parallel producer computed. The
//   partial outputs are summed over TP (tp_reduce), then the replicated bias is added.
// - Vocabulary-parallel: the embedding and output head (tied or not) hold rows [r·Vp/TP,
//   (r+1)·Vp/TP) of the padded table. A lookup outside a rank's rows gives zero and the lookups are
//   summed over TP; the head's logits stay split, and the cross-entropy reduces the row max and
//   the sum of exponentials over TP instead of gathering them (model/ops/vocab_parallel.h).
// - Replicated on every TP rank: norms, positions, row-parallel biases. Their inputs and output
//   gradients are whole and bit-identical on every TP rank (tp_copy / tp_reduce make them so), so
//   their gradients already are too: they are reduced over the data ranks (DP × GTP) only, like
//   every gradient — a TP peer trains on the same micro-batches.
// GTP composes as in Megatron: it shards dim 0 of the TP-local weight (parallel/gtp.h), so a rank
// stores 1/(TP·G) of every sharded weight; the TP slice stays split through the GEMM.
// Parameter names and checkpoints are those of the full model: a checkpoint holds full tensors
// (tp_full_of), each rank loads its part (tp_local_of).
//
// Note [replicated key/value heads]
// The llama family's k and v row groups hold NKV heads. When TP divides NKV each rank holds
// NKV/TP of them, as above. When TP is a multiple of NKV (Megatron-LM's and vLLM's rule) each rank
// holds one, replicated: the R = TP/NKV consecutive ranks r with r / R = j hold head j — exactly
// the head their query heads [r·NH/TP, (r+1)·NH/TP) read. TpSlice::group_replicas says so per row
// group, and every slicing function honours it: a rank's part of a replicated group is piece r / R
// of the group's TP/R pieces, the init cuts it from the full tensor of (seed, name) like any part
// (so the copies equal the one-process rows, Qwen2's bias included), and tp_full_of takes the
// first copy of each piece (checking that the others are bit-identical).
// The forward needs nothing more. In the backward each rank's dK, dV cover its own query heads
// only: the input gradient dK·W_k + ... still sums to the full one over TP (tp_copy's reduction),
// but the copies' weight and bias gradients are partial sums over the R ranks sharing them. The
// trainer sums them over those ranks once per step, after the data-parallel reduction (an
// all-reduce over the TP group with each rank's copy at its head's slot: CommTensorParallel::
// sum_replicated), so every copy gets the full gradient bit for bit and AdamW keeps the copies
// identical. The gradient norm counts each copy once (the first rank of each R adds it). The q/k
// norms' gradients stay partial over TP as before: summed over every TP rank they are complete.
//
// Note [tensor parallelism at one rank]
// With TpContext::through_group at size 1 every split layer, the vocab-parallel embedding and
// cross-entropy and every TP op run as at TP > 1, over a one-rank group (NCCL on a GPU), with
// whole weights. Each then computes what the plain path does with the same kernels, so the loss
// is bit-identical: the vocab-parallel CE runs the single-GPU CE kernels with the group's max and
// sum in between (a one-rank reduction moves no value), the lookups go through the same gather
// and sorted scatter-add. Two rules keep the CUDA fusions exact at every TP size: a row-parallel
// bias is added where the sum over TP is complete — in the GEMM's epilogue when the group has one
// rank, after the reduction otherwise; and the CUDA LayerNorm fused into the qkv GEMM
// (layernorm_linear) sums its normalized rows' gradient over TP inside its backward, where tp_copy
// would sit between the two ops.
//
// Note [sequence parallelism]
// With parallel.sequence_parallel the regions between the split GEMMs — the norms, the residual
// stream, positions and the MTP norms — hold this rank's chunk of the sequence, positions
// [r·T/TP, (r+1)·T/TP) of every row: a column-parallel layer all-gathers its input's tokens
// (tp_gather_tokens; backward reduce-scatter) instead of tp_copy, a row-parallel layer
// reduce-scatters its partial outputs (tp_scatter_tokens; backward all-gather) instead of
// tp_reduce, the embedding reduce-scatters its lookups, the MTP projection splits its gathered
// output back into chunks, and the head gathers the final norm's tokens. Activation memory of
// those regions is 1/TP; the communication volume is the same. The replicated parameters now
// see 1/TP of the tokens each, so their gradients are partial sums and reduce over the whole
// world (DP × GTP × TP), not over the data ranks only.
#pragma once

#include <cstdint>
#include <vector>

#include "model/ops/tp_comm.h"
#include "model/tensor.h"

namespace gtron {

// How a layer is split (Note [tensor-parallel layout]).
enum class TpMode { kNone, kColumn, kColumnGathered, kRow };

// How a parameter is split: along dim 0 in `groups` equal row groups, each cut over TP (kRows);
// along dim 1 (kColumns); or not at all.
enum class TpSplit { kNone, kRows, kColumns };
struct TpSlice {
  TpSplit split = TpSplit::kNone;
  int groups = 1;
  // kRows with row groups of different sizes (the llama family's packed q | k | v: NH·HS, NKV·HS,
  // NKV·HS rows), each cut over TP; empty: `groups` equal groups.
  std::vector<int64_t> group_rows;
  // With group_rows: per group, the R consecutive ranks that hold one same piece of it (Note
  // [replicated key/value heads]): 1 cuts the group over every rank; R > 1 cuts it into TP/R
  // pieces, rank r holding piece r / R. Empty: 1 for every group.
  std::vector<int> group_replicas;
};

// Rows [begin, end) of every rank's part that `replicas` > 1 consecutive ranks hold copies of.
struct TpReplicatedRows {
  int64_t begin = 0, end = 0;
  int replicas = 1;
};

// This process's place in the TP group; `group` is set once the group exists (the model's shapes
// need only rank and size).
struct TpContext {
  int rank = 0;
  int size = 1;
  bool sequence_parallel = false;  // Note [sequence parallelism]
  // The split layers and the TP ops run at size 1 too, over a one-rank group (a test switch: the
  // TP code path on one GPU, Note [tensor parallelism at one rank]).
  bool through_group = false;
  TensorParallelGroup* group = nullptr;
  bool active() const { return size > 1 || through_group; }
};

// The full shape of a part of shape `local`.
Shape tp_full_shape(const Shape& local, const TpSlice& slice, int size);
// A copy of rank `rank`'s part of the CPU tensor `full`.
Tensor tp_local_of(const Tensor& full, const TpSlice& slice, int rank, int size);
// The full CPU tensor from `parts`: every rank's part of shape `local`, flattened and laid end to
// end in rank order (an all-gather's output). Replicated rows come from the first rank holding
// them; GTRON_CHECK: the other copies are bit-identical.
Tensor tp_full_of(const Tensor& parts, const Shape& local, const TpSlice& slice, int size);
// The rows of a part that are copies (Note [replicated key/value heads]), in row order; the same
// for every rank. Empty when nothing is replicated (and at size 1).
std::vector<TpReplicatedRows> tp_replicated_rows(const TpSlice& slice, int size);

}  // namespace gtron
