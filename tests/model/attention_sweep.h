// The attention sweep's cells, flags and arithmetic (issue 49): what tests/model/bench_attention.cc
// times and what scripts/bench_attention.py, its PyTorch companion, lists and times the same way.
// Host-only, so the cell list, the FLOP convention and the flag checks are tested without a GPU
// (attention_sweep_test, bench_attention_list_test).
//
// Note [attention sweep cells]
// A cell is one causal self-attention shape at a fixed number of tokens a batch (B·T = --tokens,
// 16384 by default, the FlashAttention papers' setting): for each head size HS, each mode ("mha":
// NKV = NH; "gqa": NKV = NH / --group) and each length T, NH = --width / HS query heads (width
// 2048: 32 heads at HS 64, 16 at HS 128) and B = tokens / T. The order is HS, then mode, then T;
// scripts/bench_attention.py builds the same list from the same flags, and --list prints it in
// the same format in both (the test compares them).
//
// FLOPs (the FlashAttention papers' count, so TFLOP/s compare with theirs): the forward's two
// products, Q·Kᵀ and P·V, are 2·2·B·NH·T²·HS, halved for the causal mask; the backward is 2.5
// forwards (five products instead of two). GQA cells count per query head, as MHA ones.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gtron::bench {

struct AttentionCell {
  int64_t HS = 0;   // head size
  int64_t T = 0;    // sequence length
  int64_t B = 0;    // sequences: tokens / T
  int64_t NH = 0;   // query heads
  int64_t NKV = 0;  // key/value heads (NH: multi-head attention)
};

// The flags of bench_attention (the shape flags are also bench_attention.py's).
struct SweepFlags {
  std::vector<int64_t> head_sizes{64, 128};
  std::vector<std::string> modes{"mha", "gqa"};
  std::vector<int64_t> lengths{512, 1024, 2048, 4096, 8192};
  int64_t tokens = 16384;  // B·T of every cell
  int64_t width = 2048;    // NH·HS
  int64_t group = 4;       // query heads per k/v head in "gqa" cells
  int64_t warmup = 10;     // untimed calls before the timed ones
  int64_t repeats = 50;    // timed calls; the median is reported
  int64_t rotate = 3;      // input sets the calls rotate among (no timing out of L2)
  double tol = 1e-2;       // bound on the normwise relative error of the check
  int64_t seed = 1;        // of the random inputs
  // Launcher options swept as variants (Note [attention sweep variants] in bench_attention.cc):
  // plain, rope, bias, and fa3, fa3p, fa3pairs, fa3dq (not by default: compute capability 9.0
  // only).
  std::vector<std::string> variants{"plain", "rope", "bias"};
  bool list = false;  // print the cells and exit (no GPU needed)
  bool help = false;
};

// Parses argv[1..argc) into *f. Returns "" or the user error: the flag, what it got, what it
// expects. Every flag takes a value except --list and --help; lists are comma-separated.
std::string parse_sweep_flags(int argc, const char* const* argv, SweepFlags* f);

// The usage text of --help.
std::string sweep_usage();

// The cells of Note [attention sweep cells]. REQUIRES: flags as parse_sweep_flags accepts them.
std::vector<AttentionCell> sweep_cells(const SweepFlags& f);

// {"hs": 64, "T": 512, "B": 32, "nh": 32, "nkv": 32}: the cell as --list prints it (and as the
// JSON result lines begin).
std::string cell_json(const AttentionCell& c);

// Forward FLOPs of a causal cell: 4·B·NH·T²·HS / 2.
double forward_flops(const AttentionCell& c);
// Backward FLOPs: 2.5 × forward_flops.
double backward_flops(const AttentionCell& c);
// The convention above in words, for the first output line.
const char* flop_convention();
// TFLOP/s of `flops` done in `ms` milliseconds.
double tflops(double flops, double ms);
// The median of v (the mean of the two middle values for an even count). REQUIRES: v not empty.
double median(std::vector<double> v);

}  // namespace gtron::bench
