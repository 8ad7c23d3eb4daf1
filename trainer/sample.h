// `gtron sample`: the flags, their validation against the checkpoint's model, and the output.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include "model/gpt.h"
#include "trainer/text/tokenizer.h"

namespace gtron {

// --warmup: tokens per row of the untimed generation that runs first (CUDA module loading,
// cuBLASLt's first calls and its algorithm choices happen there, as in a benchmark's warm-up run).
constexpr int64_t kWarmupTokens = 8;

struct SampleArgs {
  std::string prompt;      // --prompt: text (the checkpoint's tokenizer, else one token per byte)
  std::string prompt_ids;  // --prompt-ids: "1,2,3"
  int64_t tokens = 256;    // --tokens: new tokens per row
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 1;
  int64_t batch = 1;              // --batch: the prompt decoded N times, row b with seed stream b
  bool speculative = false;       // --speculative: MTP self-speculative decoding
  bool print_ids = false;         // --print-ids: token ids out instead of text
  bool recompute = false;         // --recompute: the full-recomputation reference path
  bool no_graphs = false;         // --no-graphs: eager CUDA decoding steps (training ops)
  bool warmup = false;            // --warmup: an untimed kWarmupTokens generation first
  std::string device = "cpu";     // --device: cpu, or cuda (GPU 0)
  std::string dtype = "f32";      // --dtype: f32, or bf16 (CUDA only)
  bool prompt_given = false;      // --prompt was on the command line
  bool prompt_ids_given = false;  // --prompt-ids was on the command line
};

// The device --device names (UserError for anything else, or cuda without a GPU).
Device sample_device(const std::string& flag);
// The decoding dtype --dtype names: f32, or bf16 with --device cuda (UserError otherwise; Note
// [bf16 decoding] in model/decoder.h).
DType sample_dtype(const SampleArgs& args);

// Checks the flags against the model (a UserError naming the flag otherwise), generates, writes
// one line per row to `out` (prompt + new tokens, as text or comma-separated ids) and the stats
// JSON line (model/generate.h) to `err`. With a tokenizer (the checkpoint's tokenizer.json) text
// goes through it: the prompt is encoded after the end-of-text token (documents start with it)
// and the new tokens are decoded; without one, text is byte-level (vocab_size >= 256).
void run_sample(GPT& model, const SampleArgs& args, std::ostream& out, std::ostream& err,
                Tokenizer* tokenizer = nullptr);

}  // namespace gtron
