#include "model/decoder.h"

#include <algorithm>

#include "model/decode_cuda.h"
#include "model/decode_ops.h"
#include "model/mixed_precision.h"
#include "model/ops/add.h"
#include "model/ops/embedding.h"
#include "model/ops/linear.h"
#include "model/sampling.h"
#include "model/stream.h"

namespace gtron {

Decoder::Decoder(const GPT& model, int64_t batch, bool keep_hidden, int64_t capacity,
                 StepGraphs* graphs, DType act)
    : model_(model),
      batch_(batch),
      capacity_(capacity > 0 ? capacity : model.config().context_length),
      graphs_(model.token_embedding().data.device().is_cuda() ? graphs : nullptr),
      act_(act == DType::kBF16 ? act : model.token_embedding().data.dtype()) {
  const GPTConfig& c = model.config();
  GTRON_CHECK(batch >= 1 && capacity_ <= c.context_length, "Decoder for ", batch, " rows of ",
              capacity_, " positions (context ", c.context_length, ")");
  GTRON_CHECK(c.tp_size == 1, "generation runs on one process, not split over TP");
  const Tensor& wte = model.token_embedding().data;
  fused_ = graphs_ != nullptr && !c.llama() && act_ != DType::kBF16;
  if (act_ == DType::kBF16) {  // Note [bf16 decoding]
    GTRON_CHECK(wte.device().is_cuda() && wte.dtype() == DType::kF32,
                "bf16 decoding needs an fp32 model on CUDA, not ", wte.device().str(), "/",
                dtype_name(wte.dtype()));
    auto bf16 = std::make_unique<Bf16Weights>();
    NoGradGuard no_grad;
    for (Parameter* p : model.parameters()) bf16->use(*p);  // every cast now, none captured
    weights_ = std::move(bf16);
  } else {
    weights_ = std::make_unique<DirectWeights>();
  }
  // Key/value heads and their size: GPT-2's n_head of C / NH, the llama family's NKV of head_dim.
  const int64_t NKV = c.llama() ? c.llama_dims().NKV : c.n_head;
  const int64_t HS = c.llama() ? c.llama_dims().HS : c.n_embd / c.n_head;
  for (int l = 0; l < c.n_layer; ++l) {
    main_caches_.emplace_back(batch, capacity_, NKV, HS, act_, wte.device());
  }
  for (int k = 1; k <= c.mtp_depth; ++k) {
    mtp_caches_.emplace_back(batch, capacity_, NKV, HS, act_, wte.device());
    if (keep_hidden) {
      stores_.push_back(Tensor::zeros({batch, capacity_, c.n_embd}, act_, wte.device()));
    }
  }
}

Decoder::~Decoder() = default;

DecodeWindow Decoder::window_of(const WindowInput& in, bool device_extents) const {
  GTRON_CHECK(static_cast<int64_t>(in.tokens.size()) == batch_ &&
                  static_cast<int64_t>(in.start.size()) == batch_ &&
                  static_cast<int64_t>(in.want.size()) == batch_,
              "a decode window needs tokens, start and want for each of ", batch_, " rows");
  DecodeWindow win;
  for (int64_t b = 0; b < batch_; ++b) {
    const auto n = static_cast<int64_t>(in.tokens[b].size());
    GTRON_CHECK(in.start[b] >= 0 && in.start[b] + n <= capacity_, "row ", b, ": positions [",
                in.start[b], ", ", in.start[b] + n, ") outside the caches of ", capacity_,
                " positions");
    for (int64_t slot : in.want[b]) {
      GTRON_CHECK(slot >= 0 && slot < n, "row ", b, ": logits of slot ", slot, " of ", n);
    }
    win.start.push_back(in.start[b]);
    win.count.push_back(n);
    win.width = std::max(win.width, n);
  }
  GTRON_CHECK(win.width > 0, "a decode window with no tokens");
  const Device dev = model_.token_embedding().data.device();
  if (device_extents && dev.is_cuda()) {
    win.device_start_count = win.start_count_ids().to(dev, &current_stream(dev));
  }
  return win;
}

// i32 [B, W] on the CPU: the tokens of each slot (padding: 0), or its position.
Tensor Decoder::slot_ids(const WindowInput& in, const DecodeWindow& win, bool positions) const {
  const int64_t W = win.width;
  const int64_t V = model_.config().vocab_size;
  std::vector<int32_t> ids(static_cast<size_t>(batch_ * W), 0);
  for (int64_t b = 0; b < batch_; ++b) {
    for (int64_t i = 0; i < W; ++i) {
      int32_t& id = ids[b * W + i];
      if (positions) {
        id = static_cast<int32_t>(win.position(b, i, capacity_));
      } else if (i < win.count[b]) {
        id = in.tokens[b][i];
        GTRON_CHECK(id >= 0 && id < V, "token ", id, " outside the vocabulary of ", V);
      }
    }
  }
  return Tensor::from_ints(ids, {batch_, W});  // the embedding op moves it to a CUDA table
}

namespace {

// The blocks' attention during decoding: the window's queries against the block's cache.
TransformerBlock::Attention against(KVCache& cache, const DecodeWindow& win) {
  return [&cache, &win](const Var& qkv) { return cached_attention(qkv, cache, win); };
}

// A llama block's: the window's q and k rotated at their positions, then against the cache
// (Note [decode RoPE] in model/kv_cache.h).
LlamaBlock::Attention against(KVCache& cache, const DecodeWindow& win, const LlamaBlock& block) {
  return [&cache, &win, &block](const Var& qkv) {
    const Var rotated =
        rope_window(qkv, block.inv_freq, block.NH, block.NKV, static_cast<int>(block.HS), win);
    return cached_attention(rotated, cache, win);
  };
}

const int32_t* device_extents(const DecodeWindow& win) {
  GTRON_CHECK(win.device_start_count.defined(), "a CUDA decode window without device extents");
  return win.device_start_count.data<int32_t>();
}

std::vector<int32_t> argmax_each(const std::vector<float>& logits, int64_t V) {
  std::vector<int32_t> ids;
  for (size_t r = 0; r * static_cast<size_t>(V) < logits.size(); ++r) {
    ids.push_back(argmax(&logits[r * static_cast<size_t>(V)], V));
  }
  return ids;
}

}  // namespace

void Decoder::save(int store, const Var& x, const DecodeWindow& win) {
  if (store >= static_cast<int>(stores_.size())) return;
  const int64_t W = win.width, C = model_.config().n_embd;
  if (x.device().is_cuda()) {
    cuda::save_store_rows(x.value().raw(), stores_[store].raw(), device_extents(win), batch_, W,
                          capacity_, C, x.dtype(), current_stream(x.device()).native());
    return;
  }
  Tensor rows = stores_[store].view({batch_ * capacity_, C});
  Tensor src = x.value().view({batch_ * W, C});
  for (int64_t b = 0; b < batch_; ++b) {
    const int64_t n = win.count[b], s0 = b * capacity_ + win.start[b];
    if (n > 0) rows.rows(s0, s0 + n).copy_from(src.rows(b * W, b * W + n));
  }
}

Var Decoder::load(int store, const DecodeWindow& win) const {
  GTRON_CHECK(store < static_cast<int>(stores_.size()),
              "MTP depths read hidden stores: make the Decoder with keep_hidden");
  const int64_t W = win.width, C = model_.config().n_embd;
  const Tensor& s = stores_[store];
  if (s.device().is_cuda()) {
    Stream& st = current_stream(s.device());
    Tensor out = Tensor::empty({batch_, W, C}, s.dtype(), s.device(), &st);
    cuda::load_store_rows(s.raw(), out.raw(), device_extents(win), batch_, W, capacity_, C,
                          s.dtype(), st.native());
    return Var::constant(out);
  }
  Tensor out = Tensor::zeros({batch_, W, C}, s.dtype(), s.device());
  Tensor dst = out.view({batch_ * W, C});
  Tensor rows = s.view({batch_ * capacity_, C});
  for (int64_t b = 0; b < batch_; ++b) {
    const int64_t n = win.count[b], s0 = b * capacity_ + win.start[b];
    if (n > 0) dst.rows(b * W, b * W + n).copy_from(rows.rows(s0, s0 + n));
  }
  return Var::constant(out);
}

Var Decoder::use(Parameter& p) const { return weights_->use(p); }

Var Decoder::head(const Var& rows) const {
  if (!fused_) return linear(model_.final_norm_forward(rows), use(model_.output_head()), Var());
  LinearLayer head;
  head.weight = &model_.output_head();
  return decode_linear(rows, head, Var(), false, &model_.final_norm());
}

// Gathers the wanted slots' rows of x [B, W, C] (an embedding lookup into x viewed as a table of
// B·W rows), then the final norm and the head over those rows only.
Tensor Decoder::logits_at(const Var& x, const WindowInput& in, const DecodeWindow& win) {
  std::vector<int32_t> rows;
  for (int64_t b = 0; b < batch_; ++b) {
    for (int64_t slot : in.want[b]) rows.push_back(static_cast<int32_t>(b * win.width + slot));
  }
  if (rows.empty()) return Tensor();
  const int64_t C = model_.config().n_embd, N = static_cast<int64_t>(rows.size());
  Var logits = head(embedding(Tensor::from_ints(rows, {N}),
                              Var::constant(x.value().view({batch_ * win.width, C}))));
  return logits.value().device().is_cpu() ? logits.value() : logits.value().to(Device::cpu());
}

namespace {

// The first V columns of each row of host logits [N, Vp], as fp32 (main(), depth()).
std::vector<float> real_columns_f32(Tensor host, int64_t V) {
  if (!host.defined()) return {};
  if (host.dtype() != DType::kF32) host = host.to(DType::kF32);
  const int64_t N = host.dim(0), Vp = host.dim(1);
  const float* p = host.data<float>();
  std::vector<float> out(static_cast<size_t>(N * V));
  for (int64_t r = 0; r < N; ++r) std::copy(p + r * Vp, p + r * Vp + V, out.begin() + r * V);
  return out;
}

std::vector<double> real_columns_f64(const Tensor& host, int64_t V) {
  if (!host.defined()) return {};
  const std::vector<double> all = host.to_vector();
  const int64_t N = host.dim(0), Vp = host.dim(1);
  std::vector<double> out(static_cast<size_t>(N * V));
  for (int64_t r = 0; r < N; ++r) {
    std::copy(all.begin() + r * Vp, all.begin() + r * Vp + V, out.begin() + r * V);
  }
  return out;
}

}  // namespace

Var Decoder::run_main(const Tensor& tokens, const Tensor& positions, const DecodeWindow& win) {
  if (model_.config().llama()) {  // no position table: positions enter through RoPE only
    Var x = embedding(tokens, use(model_.token_embedding()));
    for (int l = 0; l < model_.num_blocks(); ++l) {
      const LlamaBlock& block = model_.llama_block(l);
      x = block.forward(x, *weights_, against(main_caches_[static_cast<size_t>(l)], win, block));
    }
    save(0, x, win);
    return x;
  }
  Var x = add(embedding(tokens, use(model_.token_embedding())),
              embedding(positions, use(model_.position_embedding())));
  for (int l = 0; l < model_.num_blocks(); ++l) {
    const auto attend = against(main_caches_[static_cast<size_t>(l)], win);
    x = fused_ ? decode_block(model_.block(l), x, attend)
               : model_.block(l).forward(x, *weights_, attend);
  }
  save(0, x, win);
  return x;
}

Var Decoder::run_depth(int k, const Tensor& tokens, const DecodeWindow& win) {
  GTRON_CHECK(k >= 1 && k <= model_.config().mtp_depth, "MTP depth ", k, " of ",
              model_.config().mtp_depth);
  const MTPModule& m = model_.mtp_module(k);
  Var emb = embedding(tokens, use(model_.token_embedding()));
  KVCache& cache = mtp_caches_[static_cast<size_t>(k - 1)];
  const Var h = load(k - 1, win);
  const TransformerBlock::Attention attend =
      m.llama ? against(cache, win, *m.llama) : against(cache, win);
  Var x = fused_ ? decode_depth(m, h, emb, attend) : m.forward(h, emb, *weights_, attend);
  save(k, x, win);
  return x;
}

Tensor Decoder::main_logits(const WindowInput& in) {
  NoGradGuard no_grad;
  const DecodeWindow win = window_of(in, true);
  return logits_at(run_main(slot_ids(in, win, false), slot_ids(in, win, true), win), in, win);
}

Tensor Decoder::depth_logits(int k, const WindowInput& in) {
  NoGradGuard no_grad;
  const DecodeWindow win = window_of(in, true);
  return logits_at(run_depth(k, slot_ids(in, win, false), win), in, win);
}

std::vector<float> Decoder::main(const WindowInput& in) {
  return real_columns_f32(main_logits(in), model_.config().vocab_size);
}

std::vector<float> Decoder::depth(int k, const WindowInput& in) {
  return real_columns_f32(depth_logits(k, in), model_.config().vocab_size);
}

std::vector<double> Decoder::main_f64(const WindowInput& in) {
  return real_columns_f64(main_logits(in), model_.config().vocab_size);
}

std::vector<double> Decoder::depth_f64(int k, const WindowInput& in) {
  return real_columns_f64(depth_logits(k, in), model_.config().vocab_size);
}

std::vector<int32_t> Decoder::main_argmax(const WindowInput& in) {
  std::vector<int32_t> ids;
  if (replay_argmax(0, in, &ids)) return ids;
  return argmax_each(main(in), model_.config().vocab_size);
}

std::vector<int32_t> Decoder::depth_argmax(int k, const WindowInput& in) {
  std::vector<int32_t> ids;
  if (replay_argmax(k, in, &ids)) return ids;
  return argmax_each(depth(k, in), model_.config().vocab_size);
}

}  // namespace gtron
