// The Decoder's captured greedy steps (Note [decode graphs] in model/decoder.h): what a step
// captures and how it is fed; the capture itself is the decoder's StepGraphs.
#include <cstring>

#include "model/decode_cuda.h"
#include "model/decoder.h"
#include "model/stream.h"

namespace gtron {

namespace {

// Does `want` ask for exactly what the graph of module k computes: every real slot of each row
// (main), or the last real slot of each row that has one (a depth)?
bool graph_covers(int k, const WindowInput& in) {
  for (size_t b = 0; b < in.tokens.size(); ++b) {
    const auto n = static_cast<int64_t>(in.tokens[b].size());
    const std::vector<int64_t>& want = in.want[b];
    if (k == 0) {
      if (static_cast<int64_t>(want.size()) != n) return false;
      for (int64_t i = 0; i < n; ++i) {
        if (want[static_cast<size_t>(i)] != i) return false;
      }
    } else if (n == 0 ? !want.empty() : (want.size() != 1 || want[0] != n - 1)) {
      return false;
    }
  }
  return true;
}

// Windows are padded to a power of two slots: speculative decoding's windows vary in width from
// round to round (a depth's spans the drafts accepted last round), and this bounds the graphs
// to capture at a few per module for the price of a few padding slots.
int64_t graph_width(int64_t W) {
  int64_t g = 1;
  while (g < W) g *= 2;
  return g;
}

}  // namespace

Decoder::GraphStep& Decoder::step_for(int k, const DecodeWindow& win) {
  const int64_t B = batch_, W = win.width, C = model_.config().n_embd;
  std::unique_ptr<GraphStep>& slot = steps_[{k, W}];
  if (slot) return *slot;
  auto g = std::make_unique<GraphStep>();
  const Device dev = model_.token_embedding().data.device();
  Stream& s = current_stream(dev);
  const int64_t N = k == 0 ? B * W : B;
  g->window = Tensor::zeros({2 * B * W + 2 * B}, DType::kI32, dev, &s);
  g->host_window = cuda::PinnedBuffer(static_cast<size_t>(2 * B * W + 2 * B) * sizeof(int32_t));
  g->host_ids = cuda::PinnedBuffer(static_cast<size_t>(N) * sizeof(int32_t));
  DecodeWindow extents = win;  // host extents: only the capture's own checks read them
  extents.device_start_count = g->window.rows(2 * B * W, 2 * B * W + 2 * B);
  const Tensor tokens = g->window.rows(0, B * W).view({B, W});
  const Tensor positions = g->window.rows(B * W, 2 * B * W).view({B, W});
  g->graph = graphs_->capture(s, [&] {
    Tensor rows;
    if (k == 0) {
      rows = run_main(tokens, positions, extents).value().view({B * W, C});
    } else {
      const Var x = run_depth(k, tokens, extents);
      rows = Tensor::empty({B, C}, x.dtype(), dev, &s);
      cuda::gather_last_slots(x.value().raw(), rows.raw(),
                              extents.device_start_count.data<int32_t>(), B, W, C, x.dtype(),
                              s.native());
    }
    const Var logits = head(Var::constant(rows));
    g->ids = Tensor::empty({N}, DType::kI32, dev, &s);
    cuda::argmax_rows(logits.value().raw(), g->ids.data<int32_t>(), N, model_.config().vocab_size,
                      logits.shape()[1], logits.dtype(), s.native());
  });
  slot = std::move(g);
  return *slot;
}

bool Decoder::replay_argmax(int k, const WindowInput& in, std::vector<int32_t>* ids) {
  if (!graphs_) return false;
  NoGradGuard no_grad;
  DecodeWindow win = window_of(in, false);  // checks the window on the host
  if (win.width > kMaxGraphWidth || !graph_covers(k, in)) return false;
  win.width = graph_width(win.width);
  const int64_t B = batch_, W = win.width, V = model_.config().vocab_size;
  GraphStep& g = step_for(k, win);
  auto* host = static_cast<int32_t*>(g.host_window.data());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < W; ++i) {
      int32_t id = 0;
      if (i < win.count[b]) {
        id = in.tokens[b][i];
        GTRON_CHECK(id >= 0 && id < V, "token ", id, " outside the vocabulary of ", V);
      }
      host[b * W + i] = id;
      host[B * W + b * W + i] = static_cast<int32_t>(win.position(b, i, capacity_));
    }
    host[2 * B * W + b] = static_cast<int32_t>(win.start[b]);
    host[2 * B * W + B + b] = static_cast<int32_t>(win.count[b]);
  }
  Stream& s = current_stream(g.window.device());
  cuda::memcpy_async(g.window.raw(), host, g.host_window.bytes(), s.native());
  g.graph->replay(s);
  cuda::memcpy_async(g.host_ids.data(), g.ids.raw(), g.host_ids.bytes(), s.native());
  s.synchronize();
  const auto* got = static_cast<const int32_t*>(g.host_ids.data());
  ids->clear();
  for (int64_t b = 0; b < B; ++b) {
    if (k == 0) {
      for (int64_t i = 0; i < win.count[b]; ++i) ids->push_back(got[b * W + i]);
    } else if (win.count[b] > 0) {
      ids->push_back(got[b]);
    }
  }
  return true;
}

}  // namespace gtron
