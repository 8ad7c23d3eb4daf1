// Runs a GPT's modules over decode windows (Note [decode windows] in model/kv_cache.h) for a batch
// of rows: the main model and each MTP depth keep one KVCache per block, allocated once for the
// context length. The generation loops (model/generate.h) drive it. Either family: GPT-2 adds
// its learned positions; the llama family caches its NKV key/value heads, already rotated at
// their positions (Note [decode RoPE] in model/kv_cache.h).
//
// Note [MTP hidden stores]
// Depth k at position s combines the hidden state of depth k-1 at s (k = 1: the main model's last
// hidden state, before the final norm) with the embedding of token s+k, as in training
// (model/gpt.h). A depth's window can start before the positions the previous module just ran
// (its cached positions that used drafted tokens are recomputed once the real tokens are known),
// so the decoder keeps, per module feeding a depth, its hidden states at every position:
// stores[k] [B, capacity, C] for k = 0..D-1, written by each window at its real slots.
//
// Note [decode graphs]
// On CUDA a decoding step is a few hundred small kernels (12 per block), so run eagerly it costs
// its launches and the host work around them, several times what its weight reads cost. The
// greedy calls (main_argmax, depth_argmax) therefore replay one CUDA graph per (module, window
// width), captured at its first use; widths up to kMaxGraphWidth are padded to a power of two
// (speculative windows vary from round to round), so a module has a few graphs. The graph reads
// the window from a device buffer (tokens [B·W], positions [B·W], start [B], count [B]; every
// kernel on the path takes the window's extents from there: embeddings, cached attention, the
// hidden stores, the gather of a depth's last slots), runs the module, the final norm and the
// head, and ends with the argmax of each slot's logits. A step is then one host-to-device copy
// of that buffer from pinned memory, one replay, one device-to-host copy of the B·W (main) or B
// (depth) token ids and one stream sync. The head runs at every slot of the main model's window
// (the verify pass wants them all; padding slots are computed and ignored) and at the last real
// slot of each row for a depth (what drafting wants); other `want` patterns, wider windows
// (prefills) and every call without graphs run eagerly. The capture itself is a StepGraphs
// (model/step_graphs.h) that whoever drives decoding passes in (trainer/sample.cc through
// GenerateOptions::graphs, the GPU tests); graphs/decode_graphs.h implements it on graphs::Graph,
// so model/ does not depend on graphs/. Memory a capture allocates comes from that object's
// private pool (a graphs::GraphPool), so addresses stay valid for every replay; the graphs run
// one at a time on one stream, so they may share it. What a step captures and how it is fed
// (the window buffers, the last-slot gather, the argmax) stay in model/ (model/decoder_graphs.cc,
// model/decode_cuda.h). The caches and stores live outside the pool, and eager and replayed steps
// mix freely over them. A replay runs the eager path's kernels; only its GEMMs see more rows
// (padding slots, every slot at the head), which cuBLAS may round differently.
// The fused block is GPT-2's in fp32 (LayerNorm, GELU, learned positions, one K/V head per query
// head). A llama-family model (RoPE, RMSNorm, SwiGLU, grouped-query caches) and a bf16 decoder
// capture the training ops themselves: the llama block's forward with the cached attention of
// Note [decode RoPE] (model/kv_cache.h), whose rotation reads each row's start from the window
// buffer on the device (rope_forward_at), so one graph serves every position.
//
// Note [bf16 decoding]
// `gtron sample --dtype bf16` decodes as the bf16 training forward computes: the model keeps its
// fp32 weights, and the decoder reads them through a Bf16Weights (model/mixed_precision.h): every
// GEMM and the embedding read bf16 copies, cast once when the decoder is made (before any
// capture, so no graph holds a cast), and the norms read their fp32 weights; activations, the
// key/value caches and the MTP hidden stores are bf16, the head's logits too (the argmax and the
// host copy read them as they are). GPT-2's learned positions go through the same access (bf16
// rows added to the bf16 token rows), and a bf16 GPT-2 decoder runs the training ops, not the
// fused block. fp32 stays the default and the reference: bf16 tokens may part from fp32's
// wherever two logits lie within bf16 rounding.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "model/cuda/runtime.h"
#include "model/gpt.h"
#include "model/kv_cache.h"
#include "model/step_graphs.h"

namespace gtron {

// One window's input: row b feeds tokens[b] (its real slots; empty: the row sits this pass out)
// at positions start[b], start[b]+1, ...; `want[b]` lists the slots whose logits are needed.
struct WindowInput {
  std::vector<std::vector<int32_t>> tokens;  // [B][count_b]
  std::vector<int64_t> start;                // [B]
  std::vector<std::vector<int64_t>> want;    // [B][...] slots in [0, count_b)
};

class Decoder {
 public:
  static constexpr int64_t kMaxGraphWidth = 16;

  // Caches for `batch` rows of `capacity` positions (0: model.config().context_length, the most
  // allowed), in the model's dtype and on its device, allocated here once. keep_hidden: keep the
  // MTP hidden stores (speculative decoding needs them). graphs (CUDA only; ignored on CPU):
  // capture and replay the greedy calls through it (Note [decode graphs]) and run the blocks
  // through the decoder's fused composition (Note [decode fast block] in model/decode_ops.h),
  // eager calls too (GPT-2 in fp32); null runs the training ops eagerly. The model and `graphs`
  // must outlive the decoder; its parameters are read through the decoder's own weight access
  // (direct, or bf16 shadows).
  // act: the activations' dtype: the model's own (f32; f64 on the CPU), or kBF16 for an fp32
  // CUDA model, which then decodes as a bf16 training forward computes (Note [bf16 decoding]).
  Decoder(const GPT& model, int64_t batch, bool keep_hidden, int64_t capacity = 0,
          StepGraphs* graphs = nullptr, DType act = DType::kF32);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  int64_t batch() const { return batch_; }
  int64_t graphs_captured() const { return static_cast<int64_t>(steps_.size()); }

  // The main model over the window: writes its keys/values (and store 0) at the real slots and
  // returns the logits of the wanted slots, fp32 rows of V (the real vocabulary) in row order,
  // then slot order within a row. REQUIRES: tokens in [0, V), start[b] + count_b <= capacity.
  std::vector<float> main(const WindowInput& in);
  // MTP depth k (1..D): slot i of row b combines store k-1 at position start[b]+i (which must
  // hold that position's hidden state) with the embedding of tokens[b][i] (the token k ahead).
  // Writes depth k's caches (and store k when k < D); returns the wanted logits as main() does.
  std::vector<float> depth(int k, const WindowInput& in);
  // main() and depth() with the logits in double: the model's own values, unrounded for an f64
  // model (the tests hold f64 decoding to the full forward at 1e-10).
  std::vector<double> main_f64(const WindowInput& in);
  std::vector<double> depth_f64(int k, const WindowInput& in);
  // As main() and depth(), but only the argmax token of each wanted slot (greedy decoding), in
  // the same order: the same tokens as argmax over the logits those return, up to the rounding
  // of the head's GEMM (Note [decode graphs]).
  std::vector<int32_t> main_argmax(const WindowInput& in);
  std::vector<int32_t> depth_argmax(int k, const WindowInput& in);

 private:
  // One captured (module, width) step. The graph reads `window` and writes `ids`; the pinned
  // buffers stage the copies around each replay (rewritten only after the step's sync).
  struct GraphStep {
    std::unique_ptr<StepGraph> graph;
    Tensor window;  // i32 [2·B·W + 2·B] on the device: tokens, positions, start, count
    Tensor ids;     // i32 [N]: the argmax of each slot (main: N = B·W) or of each row's last slot
    cuda::PinnedBuffer host_window;
    cuda::PinnedBuffer host_ids;
  };

  DecodeWindow window_of(const WindowInput& in, bool device_extents) const;
  Tensor slot_ids(const WindowInput& in, const DecodeWindow& win, bool positions) const;
  // The modules over slot ids (i32 [B, W], CPU or the model's device): hidden states [B, W, C].
  Var run_main(const Tensor& tokens, const Tensor& positions, const DecodeWindow& win);
  Var run_depth(int k, const Tensor& tokens, const DecodeWindow& win);
  // Hidden states x [B, W, C] -> store rows at the real slots, and back.
  void save(int store, const Var& x, const DecodeWindow& win);
  Var load(int store, const DecodeWindow& win) const;
  Var head(const Var& rows) const;            // [N, C] -> logits [N, Vp]
  Var use(Parameter& p) const;                // p through weights_
  Tensor main_logits(const WindowInput& in);  // main() and depth() before the copy out
  Tensor depth_logits(int k, const WindowInput& in);
  // The wanted slots' logits [N, Vp] on the CPU, in the model's dtype (f32 from CUDA).
  Tensor logits_at(const Var& x, const WindowInput& in, const DecodeWindow& win);
  // Greedy through a graph (Note [decode graphs]); false when this call must run eagerly.
  bool replay_argmax(int k, const WindowInput& in, std::vector<int32_t>* ids);
  GraphStep& step_for(int k, const DecodeWindow& win);  // captured at its first use

  const GPT& model_;
  int64_t batch_;
  int64_t capacity_;                  // positions per row in every cache and store
  StepGraphs* graphs_;                // null (or a CPU model): every call eager, the training ops
  std::vector<KVCache> main_caches_;  // [L]
  std::vector<KVCache> mtp_caches_;   // [D]
  std::vector<Tensor> stores_;        // [D] of [B, capacity, C] (empty without keep_hidden)
  DType act_;                         // activations, caches and stores
  std::unique_ptr<WeightAccess> weights_;  // DirectWeights, or Bf16Weights for act_ = bf16
  bool fused_ = false;  // GPT-2 in fp32 on CUDA with graphs: the fused block (decode_block)
  std::map<std::pair<int, int64_t>, std::unique_ptr<GraphStep>> steps_;
};

}  // namespace gtron
