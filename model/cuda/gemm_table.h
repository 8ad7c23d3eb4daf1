// The GEMM problem key and the table of pinned cuBLASLt algorithms (host-only: no CUDA headers,
// so the matching logic is tested without a GPU).
//
// Note [pinned GEMM algorithms]
// Every GEMM problem runs one cuBLASLt algorithm for the life of the process (the cache in
// gemm.cu), and that algorithm must be the same on every run of the same build on the same
// machine: two runs give bit-identical results. cuBLASLt's heuristic is deterministic for one
// library version, device and problem, so "heuristic result i of the first n requested" names one
// algorithm as firmly as result 0 does. Result 0 is not always the fastest (on the H200 the
// split-K weight-gradient choices add separate reduction kernels, for one), so:
// - Run-time autotuning is out: timing is noisy, so two runs could pick different algorithms
//   (different bits), and the pick would depend on what else the GPU was doing.
// - Instead, GTRON_GEMM_TUNE=1 (gemm_tune.h) times the candidates offline and prints a table
//   entry per problem; scripts/tune_gemm.sh collects them, and the entries worth having (at
//   least 3% faster than result 0) are committed in gemm_tuned.inc.
// - At run time an entry applies only when the device name and cublasLtGetVersion() match the
//   ones it was measured with, and the key matches exactly; then the GEMM requests `requested`
//   results (the count used when tuning, so the ordering is the one that was timed) and runs
//   result `index`, or result 0 when fewer came back. Everything else takes result 0 as before.
// The entries record enum values (DType, Epilogue) as numbers: reordering those enums
// invalidates the table (regenerate it with scripts/tune_gemm.sh).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/cuda/gemm.h"

namespace gtron::cuda {

// The positions in GemmKey. Alignments are those of the operands' addresses (and batch strides)
// in bytes, the largest power of two <= 256 dividing them: a cached or pinned choice never meets
// a less aligned operand than it was picked for.
enum GemmKeyField {
  kKeyM,
  kKeyN,
  kKeyK,
  kKeyBatch,
  kKeyStrideA,
  kKeyStrideB,
  kKeyStrideC,
  kKeyTransA,
  kKeyTransB,
  kKeyAbType,  // static_cast<int>(DType)
  kKeyCType,   // static_cast<int>(DType)
  kKeyAlignB,  // cuBLAS operand 1 (Note [row-major through column-major cuBLAS] in gemm.cu)
  kKeyAlignA,  // cuBLAS operand 2
  kKeyAlignC,
  kKeyAlignBias,  // 0 without a bias
  kKeyHasBias,
  kKeyBiasType,  // static_cast<int>(DType), -1 without a bias
  kKeyBetaZero,
  kKeyEpilogue,  // static_cast<int>(Epilogue)
  kKeyAux,       // aux alignment + 1000 * aux_ld, 0 without aux
  kKeyFp8,       // 0: not fp8; 1: fp8, B's scales 1x128 tiles; 2: fp8, B's 128x128 blocks (last:
                 // the committed table's entries, written before it, leave it 0)
  kGemmKeyFields
};

// (problem, pointer alignments): what an algorithm choice is cached and pinned by.
using GemmKey = std::array<int64_t, kGemmKeyFields>;

GemmKey gemm_key(const GemmArgs& g);

// One pinned choice (Note [pinned GEMM algorithms]).
struct TunedGemm {
  std::string device;       // cudaDeviceProp.name, e.g. "NVIDIA H200"
  size_t cublaslt_version;  // cublasLtGetVersion()
  GemmKey key;
  int index;      // the heuristic result to run
  int requested;  // how many results to request (the count it was tuned with; > index)
};

struct PinnedChoice {
  int index;
  int requested;
};

// The pinned choice for `key` on (device, version): the entries added by add_tuned_gemm first,
// then the committed table (gemm_tuned.inc); none when nothing matches exactly. Aborts on a
// malformed entry. Thread-safe.
std::optional<PinnedChoice> find_tuned_gemm(const std::string& device, size_t cublaslt_version,
                                            const GemmKey& key);

// The committed table, in file order.
const std::vector<TunedGemm>& committed_tuned_gemms();

// Adds an entry at run time, ahead of the committed table (tests; see
// pin_gemm_algo_for_testing in gemm.h). REQUIRES: 0 <= index < requested. Thread-safe.
void add_tuned_gemm(const TunedGemm& entry);
// Drops every entry added by add_tuned_gemm.
void clear_added_tuned_gemms();

// The entries of gemm_tuned.inc-format text (one per line as tuned_gemm_entry writes it; blank
// and // lines skipped). Throws UserError naming `source` and the line on anything else.
// GTRON_GEMM_TABLE_FILE=PATH adds a file's entries ahead of the committed table at the first
// lookup (a measurement aid: try a tuned table without rebuilding).
std::vector<TunedGemm> parse_tuned_gemm_entries(const std::string& text, const std::string& source);

// The entry as one line of gemm_tuned.inc: {"NVIDIA H200", 130100, {m, n, ...}, index, requested},
std::string tuned_gemm_entry(const TunedGemm& entry);
// The key's fields that describe the problem, as JSON members (no braces): "m": 1, "n": 2, ...
std::string gemm_key_json(const GemmKey& key);

}  // namespace gtron::cuda
