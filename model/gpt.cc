#include "model/gpt.h"

#include <algorithm>

#include "memory/caching_allocator.h"
#include "model/cuda/runtime.h"
#include "model/ops/add.h"
#include "model/ops/classifier.h"
#include "model/ops/embedding.h"
#include "model/ops/linear.h"
#include "model/ops/loss.h"
#include "model/ops/segments.h"
#include "model/ops/vocab_parallel.h"
#include "model/stream.h"

namespace gtron {

LlamaDims GPTConfig::llama_dims() const {
  LlamaDims d;
  d.C = n_embd;
  d.NH = n_head;
  d.NKV = n_kv_head > 0 ? n_kv_head : n_head;
  d.HS = head_dim > 0 ? head_dim : n_embd / n_head;
  d.F = intermediate_size > 0 ? intermediate_size : (8 * n_embd / 3 + 63) / 64 * 64;
  d.L = n_layer;
  d.std = init_std;
  d.eps = rms_norm_eps;
  d.qk_norm = qk_norm;
  d.qkv_bias = qkv_bias;
  d.rope_theta = rope_theta;
  d.llama3_scaling = rope_llama3;
  d.llama3 = rope_scaling;
  d.recompute_act = recompute == Recompute::kSelective;
  return d;
}

GPT::GPT(const GPTConfig& cfg, DType dtype, Device device, uint64_t seed)
    : cfg_(cfg), params_(dtype, device, seed) {
  GTRON_CHECK(cfg.llama() || cfg.n_embd % cfg.n_head == 0, "n_embd ", cfg.n_embd, " % n_head ",
              cfg.n_head);
  GTRON_CHECK(cfg.n_head % cfg.tp_size == 0 && cfg.padded_vocab() % cfg.tp_size == 0,
              "tensor parallelism ", cfg.tp_size, ": must divide n_head and the padded vocab");
  params_.tensor_parallel().rank = cfg.tp_rank;
  params_.tensor_parallel().size = cfg.tp_size;
  params_.tensor_parallel().through_group = cfg.tp_through_group;
  params_.tensor_parallel().sequence_parallel = cfg.sequence_parallel && cfg.tp_size > 1;
  params_.set_fp8_linears(cfg.fp8);
  const int64_t C = cfg.n_embd;
  const int64_t Vp = cfg.padded_vocab();
  const TpSlice vocab_rows{TpSplit::kRows, 1};
  wte_ = &params_.add_split("wte.weight", {Vp, C}, Init::kNormal, cfg.init_std, false, vocab_rows);
  // The padded rows are never looked up and get zero gradient from the loss: keep them zero.
  const int64_t Vl = wte_->data.dim(0), v0 = vocab_begin();  // this rank's rows [v0, v0 + Vl)
  if (Vp > cfg.vocab_size && v0 + Vl > cfg.vocab_size) {
    Tensor pad = wte_->data.rows(std::max<int64_t>(cfg.vocab_size - v0, 0), Vl);
    pad.zero_();
  }
  const BlockDims dims{C, cfg.n_head, cfg.n_layer, cfg.init_std,
                       cfg.recompute == Recompute::kSelective};
  const LlamaDims ldims = cfg.llama_dims();
  if (cfg.llama()) {
    for (int l = 0; l < cfg.n_layer; ++l) {
      llama_blocks_.emplace_back(params_, "blocks." + std::to_string(l), ldims, device,
                                 cfg.moe_block(l) ? &cfg.moe : nullptr);
    }
    norm_f_ = RMSNormLayer(params_, "norm_f", C, cfg.rms_norm_eps);
  } else {
    wpe_ = &params_.add("wpe.weight", {cfg.context_length, C}, Init::kNormal, cfg.init_std, false);
    for (int l = 0; l < cfg.n_layer; ++l) {
      blocks_.emplace_back(params_, "blocks." + std::to_string(l), dims);
    }
    ln_f_ = LayerNormLayer(params_, "ln_f", C);
  }
  if (cfg.tied_embeddings) {
    head_ = wte_;
  } else {
    head_ = &params_.add_split("lm_head.weight", {Vp, C}, Init::kNormal, cfg.init_std, true,
                               vocab_rows);
    if (Vp > cfg.vocab_size && v0 + Vl > cfg.vocab_size) {
      Tensor pad = head_->data.rows(std::max<int64_t>(cfg.vocab_size - v0, 0), Vl);
      pad.zero_();
    }
  }
  for (int k = 1; k <= cfg.mtp_depth; ++k) {
    const std::string name = "mtp." + std::to_string(k);
    if (cfg.llama()) {
      mtp_.emplace_back(params_, name, ldims, device,
                        cfg.mtp_moe && cfg.moe.E > 0 ? &cfg.moe : nullptr);
    } else {
      mtp_.emplace_back(params_, name, dims);
    }
  }
}

namespace {

// The CUDA twin of window_inputs/window_targets: out[b, t] = window[b, t + offset] for
// t < count, `fill_byte` repeated over the tail (0x00 -> 0, 0xff -> -1 = kMaskedTarget). Two
// strided copies on the current stream; no kernel, no host sync.
Tensor shifted_on_device(const Tensor& window, int64_t offset, int64_t count, int fill_byte) {
  const int64_t B = window.dim(0), T = window.dim(1) - 1;
  count = std::max<int64_t>(0, std::min(count, T));
  Stream& s = current_stream(window.device());
  Tensor out = Tensor::empty({B, T}, DType::kI32, window.device(), &s);
  const size_t row = static_cast<size_t>(T) * 4, src_row = static_cast<size_t>(T + 1) * 4;
  char* o = static_cast<char*>(out.raw());
  const char* w = static_cast<const char*>(window.raw());
  cuda::memcpy_2d_async(o, row, w + offset * 4, src_row, static_cast<size_t>(count) * 4,
                        static_cast<size_t>(B), s.native());
  cuda::memset_2d_async(o + count * 4, row, fill_byte, static_cast<size_t>(T - count) * 4,
                        static_cast<size_t>(B), s.native());
  return out;
}

}  // namespace

Tensor window_inputs(const Tensor& window, int shift) {
  const int64_t B = window.dim(0), T = window.dim(1) - 1;
  if (window.device().is_cuda()) return shifted_on_device(window, shift, T + 1 - shift, 0x00);
  // On the CPU stream, so that a captured graph re-cuts the window at every replay.
  Tensor out = Tensor::empty({B, T}, DType::kI32);
  const int32_t* w = window.data<int32_t>();
  int32_t* o = out.data<int32_t>();
  current_stream(Device::cpu()).run([=] {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        o[b * T + t] = t + shift <= T ? w[b * (T + 1) + t + shift] : 0;
  });
  return out;
}

Tensor window_targets(const Tensor& window, int shift) {
  const int64_t B = window.dim(0), T = window.dim(1) - 1;
  static_assert(kMaskedTarget == -1, "the device fill writes 0xff bytes");
  if (window.device().is_cuda()) return shifted_on_device(window, shift + 1, T - shift, 0xff);
  Tensor out = Tensor::empty({B, T}, DType::kI32);
  const int32_t* w = window.data<int32_t>();
  int32_t* o = out.data<int32_t>();
  current_stream(Device::cpu()).run([=] {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        o[b * T + t] = t + shift + 1 <= T ? w[b * (T + 1) + t + shift + 1] : kMaskedTarget;
  });
  return out;
}

void GPT::set_tensor_parallel(TensorParallelGroup* group) {
  TpContext& tp = params_.tensor_parallel();
  GTRON_CHECK(group == nullptr || (group->rank() == tp.rank && group->size() == tp.size),
              "TP group rank ", group ? group->rank() : -1, " of ", group ? group->size() : -1,
              " for a model built as rank ", tp.rank, " of ", tp.size);
  tp.group = group;
}

int64_t GPT::vocab_begin() const {
  const TpContext& tp = params_.tensor_parallel();
  return cfg_.padded_vocab() / tp.size * tp.rank;
}

Var GPT::embed(const Tensor& tokens) {
  // The embedding is a sharded weight under GTP: it goes through the weight access like the head.
  Var table = weights_->use(*wte_);
  const TpContext& tp = params_.tensor_parallel();
  Var e = tp.active() ? vocab_parallel_embedding(tokens, table, vocab_begin(), *tp.group,
                                                 tp.sequence_parallel)
                      : embedding(tokens, table);
  weights_->used(*wte_, table);
  return e;
}

Var GPT::head_input(const Var& h) {
  const TpContext& tp = params_.tensor_parallel();
  Var x = cfg_.llama() ? norm_f_.forward(h) : ln_f_.forward(h);
  if (tp.active())
    x = tp.sequence_parallel ? tp_gather_tokens(x, *tp.group) : tp_copy(x, *tp.group);
  return x;
}

Var GPT::head_logits(const Var& h) {
  Var w = weights_->use(*head_);
  Var logits = linear(head_input(h), w, Var());
  weights_->used(*head_, w);
  return logits;
}

Var GPT::head_loss(const Var& h, const Tensor& targets, double weight) {
  Var w = weights_->use(*head_);
  Var x = head_input(h);
  const KnownLossGrad known{loss_seed_, weight};
  if (!params_.tensor_parallel().active() && classifier_supported(x, w, &known)) {
    // Note [blocked classifier]: the logits are formed and consumed a block of rows at a time.
    Var ce = classifier_cross_entropy(x, w, targets, cfg_.vocab_size, known);
    weights_->used(*head_, w);
    return ce;
  }
  Var logits = linear(x, w, Var());
  weights_->used(*head_, w);
  return loss_of(logits, targets, weight);
}

Var GPT::loss_of(const Var& logits, const Tensor& targets, double weight) {
  const TpContext& tp = params_.tensor_parallel();
  // The head's logits feed only this loss: its backward may overwrite them with their gradient.
  if (tp.active()) {
    return vocab_parallel_cross_entropy(logits, targets, cfg_.vocab_size, vocab_begin(), *tp.group,
                                        /*overwrite_logits=*/true);
  }
  // Each loss reaches the total through add and scale(·, weight) only: its gradient is seed·weight.
  const KnownLossGrad known{loss_seed_, weight};
  return cross_entropy(logits, targets, cfg_.vocab_size, /*overwrite_logits=*/true,
                       loss_seed_.defined() ? &known : nullptr);
}

void GPT::mark_documents(int depth, const Tensor& tokens) {
  if (cfg_.document_start < 0) return;
  const int64_t B = tokens.dim(0), T = tokens.dim(1);
  DocumentRows& rows = document_buffers_[{depth, B, T}];
  if (!rows.seg.defined()) {
    // On the model's device, where attention reads them, whichever device the tokens come from
    // (the training step's are on it; evaluation and sampling may hand a CUDA model host tokens).
    const Device dev = params_.device();
    Stream& s = current_stream(dev);
    rows.seg = Tensor::empty({B, T}, DType::kI32, dev, &s);
    // GPT-2's trunk restarts its learned positions at each document.
    if (depth == 0 && !cfg_.llama()) rows.pos = Tensor::empty({B, T}, DType::kI32, dev, &s);
  }
  document_segments(tokens, cfg_.document_start, rows.seg,
                    rows.pos.defined() ? &rows.pos : nullptr);
  if (documents_.size() <= static_cast<size_t>(depth)) documents_.resize(depth + 1);
  documents_[static_cast<size_t>(depth)] = rows;
}

Tensor GPT::segments_of(int depth) const {
  if (cfg_.document_start < 0) return Tensor();
  GTRON_CHECK(static_cast<size_t>(depth) < documents_.size(),
              "document masking: no segments of "
              "depth ",
              depth, " (mark_documents runs before the blocks)");
  return documents_[static_cast<size_t>(depth)].seg;
}

Var GPT::trunk(const Tensor& inputs) {
  const int64_t T = inputs.dim(1);
  GTRON_CHECK(T >= 1 && T <= cfg_.context_length, "sequence length ", T, " outside [1, ",
              cfg_.context_length, "]");
  const TpContext& tp = params_.tensor_parallel();
  mark_documents(0, inputs);
  Var x = embed(inputs);
  if (!cfg_.llama()) {
    Var positions = Var::param(*wpe_);
    if (cfg_.document_start >= 0) {  // Note [document masking]: positions restart per document
      GTRON_CHECK(!tp.sequence_parallel,
                  "document masking: GPT-2 under sequence parallelism is not supported");
      x = add_positions(x, positions, documents_[0].pos);
    } else {
      if (tp.sequence_parallel) {  // this rank's chunk of the sequence (Note [sequence
                                   // parallelism])
        GTRON_CHECK(T % tp.size == 0, "sequence parallelism: T = ", T, " over ", tp.size, " ranks");
        positions = slice_rows(positions, T / tp.size * tp.rank, T / tp.size * (tp.rank + 1));
      }
      x = add_positions(x, positions);
    }
  }
  for (int l = 0; l < num_blocks(); ++l)
    x = block_runner_ ? block_runner_(l, x) : block_forward(l, x);
  return x;
}

// Note [full recompute]
// train.recompute = "full" (GPTConfig::recompute kFull): a main block keeps nothing from its
// forward but its input. The forward runs with grad mode off (no closures, so every intermediate
// is freed as soon as the next op has read it) and records one closure of its own. When that
// closure runs in the backward it runs the block's forward again on the same input, this time
// recording into a tape segment of its own (TapeScope), seeds the segment's output with the
// gradient that reached the block's output, runs the segment (run_tape: its parameter uses count
// and fire their grad-ready hooks there), and hands the input's gradient on to the block's input.
// The recomputed forward runs the same kernels on the same values, and the segment the same
// closures in the same order as the plain tape would have, so losses and gradients are the same
// bits; the price is one more forward of every main block (about a third of their time), the
// gain every block activation but the residual stream. The MTP depths keep theirs.
// It composes with every layout and graph scope, because the second forward is an ordinary
// forward recorded inside the backward:
// - GTP (parallel/gtp.h): the second forward gathers each block weight again (three gathers a
//   block weight per step instead of two, in exchange for the activations). The forward chain's
//   prefetches do not serve it (those weights were used in this pass already); begin_recompute()
//   and end_recompute() mark it, and GTP prefetches each weight of a second forward from the one
//   before it and the first weight of the next block's second forward at the end of this one
//   (Note [GTP recompute rounds]).
// - Graphs: under "layers" the block's forward graph holds the no-grad forward and its backward
//   graph the second forward with the segment's backward; under "full" the one capture holds
//   both. The readiness calls before a replay cover the second forward, which reads the same
//   parameters as the first.
// - TP and sequence parallelism: the second forward runs the same collectives again.
// tests/trainer/llama_test.cc checks the combinations on the CPU: bit for bit against no
// recompute in one process (eager, graphs layers and full), and DP, GTP (eager and layers), TP
// and TP × GTP with sequence parallelism (graphs full) against one process.
Var GPT::block_forward(int layer, const Var& x) {
  if (cfg_.recompute != Recompute::kFull || !grad_enabled() || !x.requires_grad()) {
    return plain_block_forward(layer, x);
  }
  Tensor y;
  {
    NoGradGuard no_grad;
    y = plain_block_forward(layer, x).value();
  }
  Var out = Var::output(y, /*requires_grad=*/true);
  record_backward([this, layer, x, out] {
    if (!out.has_grad()) return;
    const Var in = Var::leaf(x.value());
    Var again;
    Tape segment;
    {
      TapeScope scope;
      weights_->begin_recompute();
      again = plain_block_forward(layer, in);
      weights_->end_recompute();
      segment = scope.take();
    }
    again.set_grad(out.grad());
    run_tape(std::move(segment));
    hand_on_gradient(x, in.grad());
  });
  return out;
}

Var GPT::plain_block_forward(int layer, const Var& x) {
  GTRON_CHECK(layer >= 0 && layer < num_blocks(), "block ", layer, " of ", num_blocks());
  const Tensor seg = segments_of(0);
  if (cfg_.llama()) {
    return llama_blocks_[static_cast<size_t>(layer)].forward(x, *weights_, /*pos0=*/0, seg);
  }
  return blocks_[static_cast<size_t>(layer)].forward(x, *weights_, seg);
}

const TransformerBlock& GPT::block(int layer) const {
  GTRON_CHECK(!cfg_.llama(),
              "GPT::block: GPT-2 family only (the llama family's blocks decode "
              "through its own path)");
  GTRON_CHECK(layer >= 0 && layer < num_blocks(), "block ", layer, " of ", num_blocks());
  return blocks_[static_cast<size_t>(layer)];
}

const LlamaBlock& GPT::llama_block(int layer) const {
  GTRON_CHECK(cfg_.llama(), "GPT::llama_block: llama family only");
  GTRON_CHECK(layer >= 0 && layer < num_blocks(), "block ", layer, " of ", num_blocks());
  return llama_blocks_[static_cast<size_t>(layer)];
}

const LayerNormLayer& GPT::final_norm() const {
  GTRON_CHECK(!cfg_.llama(), "GPT::final_norm: GPT-2 family only (final_norm_forward: either)");
  return ln_f_;
}

Var GPT::final_norm_forward(const Var& h) const {
  return cfg_.llama() ? norm_f_.forward(h) : ln_f_.forward(h);
}

Parameter& GPT::position_embedding() const {
  GTRON_CHECK(wpe_ != nullptr, "the llama family has no position table");
  return *wpe_;
}

const MTPModule& GPT::mtp_module(int depth) const {
  GTRON_CHECK(depth >= 1 && depth <= cfg_.mtp_depth, "MTP depth ", depth, " of ", cfg_.mtp_depth);
  return mtp_[static_cast<size_t>(depth - 1)];
}

Tensor GPT::logits(const Tensor& inputs) {
  GTRON_CHECK(inputs.rank() == 2 && inputs.dtype() == DType::kI32, "inputs must be i32 [B, T]");
  memory::AllocKindScope kind(memory::AllocKind::kForward);
  NoGradGuard no_grad;
  weights_->begin_forward();
  const TpContext& tp = params_.tensor_parallel();
  Var logits = head_logits(trunk(inputs));
  return tp.active() ? tp_gather_features(logits, *tp.group).value() : logits.value();
}

GPTOutput GPT::forward(const Tensor& window) {
  GTRON_CHECK(window.rank() == 2 && window.dtype() == DType::kI32, "window must be i32 [B, T+1]");
  memory::AllocKindScope kind(memory::AllocKind::kForward);  // Note [allocation kinds]
  weights_->begin_forward();
  // Hidden states of every depth first, then the shared head over each: the head's 1 + D uses
  // are consecutive, so are their backwards (Note [GTP repeated backward] in parallel/gtp.h).
  std::vector<Var> hidden{trunk(window_inputs(window, 0))};
  for (int k = 1; k <= cfg_.mtp_depth; ++k) {
    // Depth k's attention masks by the documents of the tokens it embeds (Note [document
    // masking]).
    const Tensor tokens = window_inputs(window, k);
    mark_documents(k, tokens);
    hidden.push_back(mtp_[k - 1].forward(hidden.back(), embed(tokens), *weights_, segments_of(k)));
  }
  GPTOutput out;
  // The MoE balance losses, layer by layer (each layer's forward kept its own).
  for (const auto& [l, moe] : moe_layers()) {
    Var a = moe->take_aux_loss();
    if (!a.defined()) continue;
    out.moe_aux_loss = out.moe_aux_loss.defined() ? add(out.moe_aux_loss, a) : a;
  }
  for (int k = 0; k <= cfg_.mtp_depth; ++k) {
    const double weight = k == 0 ? 1.0 : cfg_.mtp_loss_weight / cfg_.mtp_depth;
    Var ce = head_loss(hidden[k], window_targets(window, k), weight);
    if (k == 0) {
      out.main_loss = ce;
      out.loss = ce;
    } else {
      out.mtp_losses.push_back(ce);
      out.loss = add(out.loss, scale(ce, weight));
    }
  }
  if (out.moe_aux_loss.defined()) out.loss = add(out.loss, out.moe_aux_loss);
  return out;
}

std::vector<std::pair<int, MoeLayer*>> GPT::moe_layers() const {
  std::vector<std::pair<int, MoeLayer*>> out;
  for (size_t l = 0; l < llama_blocks_.size(); ++l) {
    if (llama_blocks_[l].moe) out.emplace_back(static_cast<int>(l), llama_blocks_[l].moe.get());
  }
  for (size_t k = 0; k < mtp_.size(); ++k) {
    if (mtp_[k].llama && mtp_[k].llama->moe) {
      out.emplace_back(cfg_.n_layer + static_cast<int>(k), mtp_[k].llama->moe.get());
    }
  }
  return out;
}

std::vector<MoeLayerStats> GPT::moe_stats() const {
  std::vector<MoeLayerStats> out;
  for (const auto& [l, moe] : moe_layers()) out.push_back(moe->stats(l));
  return out;
}

void GPT::moe_update_bias() {
  for (const auto& [l, moe] : moe_layers()) moe->update_bias();
}

std::vector<int64_t> GPT::moe_load() const {
  std::vector<int64_t> out;
  for (const auto& [l, moe] : moe_layers()) {
    const std::vector<int64_t>& counts = moe->load();  // one pull (and wait) a layer
    out.insert(out.end(), counts.begin(), counts.end());
  }
  return out;
}

void GPT::set_moe_load(const std::vector<int64_t>& load) {
  size_t at = 0;
  for (const auto& [l, moe] : moe_layers()) {
    std::vector<int64_t>& counts = moe->load();
    GTRON_CHECK(at + counts.size() <= load.size(), "set_moe_load: ", load.size(), " counts");
    std::copy(load.begin() + static_cast<int64_t>(at),
              load.begin() + static_cast<int64_t>(at + counts.size()), counts.begin());
    at += counts.size();
  }
  GTRON_CHECK(at == load.size(), "set_moe_load: ", load.size(), " counts for ", at);
}

std::vector<std::pair<std::string, Tensor>> GPT::buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [l, moe] : moe_layers()) out.emplace_back(moe->bias_name(), moe->expert_bias());
  return out;
}

void GPT::set_expert_parallel(ExpertParallelGroup* group) {
  for (const auto& [l, moe] : moe_layers()) moe->set_expert_parallel(group);
}

bool GPT::expert_held_elsewhere(const std::string& name) const {
  for (const auto& [l, moe] : moe_layers())
    if (moe->holds_elsewhere(name)) return true;
  return false;
}

int64_t GPT::num_parameters() const {
  int64_t n = 0;
  for (const Parameter* p : params_.all()) n += p->data.numel();
  return n;
}

double GPT::flops_per_token(int64_t T) const {
  // N counts the weights that enter GEMMs: lookups (wpe, and wte when untied) do not; the head is
  // used once more per MTP depth.
  // The attention term's width is NH·HS (C for GPT-2): the query heads', whatever NKV is.
  const double C = static_cast<double>(cfg_.n_embd);
  const double head = static_cast<double>(cfg_.padded_vocab()) * C;
  double n = static_cast<double>(num_parameters());
  if (wpe_ != nullptr) n -= static_cast<double>(wpe_->data.numel());
  if (!cfg_.tied_embeddings) n -= head;
  n += cfg_.mtp_depth * head;
  // A token passes through top_k of a MoE layer's E experts (3·C·F weights each), of which this
  // process holds E/EP (Note [expert parallelism] in model/moe.h).
  const int moe_count = static_cast<int>(moe_layers().size());
  n -= moe_count * static_cast<double>(cfg_.moe.E / cfg_.moe.ep_size - cfg_.moe.top_k) * 3.0 * C *
       static_cast<double>(cfg_.moe.F);
  const double layers = cfg_.n_layer + cfg_.mtp_depth;
  const LlamaDims d = cfg_.llama_dims();
  const double width = cfg_.llama() ? static_cast<double>(d.NH * d.HS) : C;
  return 6.0 * n + 6.0 * layers * width * static_cast<double>(T);
}

}  // namespace gtron
