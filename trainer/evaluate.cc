// Evaluation, shared by `gtron train` and `gtron eval`.
#include <algorithm>
#include <cmath>

#include "trainer/data/sampler.h"
#include "trainer/data/shards.h"
#include "trainer/train.h"

namespace gtron {

EvalResult evaluate(GPT& model, const Config& cfg, const std::string& val_glob) {
  ShardSet val(val_glob, cfg.model.vocab_size);
  EvalWindows windows(val, cfg.train.seq_len);
  const int64_t T = cfg.train.seq_len, mb = cfg.train.micro_batch;
  const int64_t total = std::min(windows.num_windows(), cfg.train.eval_batches * mb);
  EvalResult r;
  r.mtp_losses.assign(static_cast<size_t>(cfg.mtp.depth), 0.0);
  NoGradGuard no_grad;
  int64_t batches = 0;
  for (int64_t first = 0; first < total; first += mb) {
    const int64_t count = std::min(mb, total - first);
    Tensor window = Tensor::empty({count, T + 1}, DType::kI32);
    windows.fill(first, count, window.data<int32_t>());
    GPTOutput out = model.forward(window);
    r.main_loss += out.main_loss.value().item();
    for (size_t k = 0; k < out.mtp_losses.size(); ++k) {
      r.mtp_losses[k] += out.mtp_losses[k].value().item();
    }
    r.tokens += count * T;
    ++batches;
  }
  if (batches > 0) {
    r.main_loss /= static_cast<double>(batches);
    for (double& l : r.mtp_losses) l /= static_cast<double>(batches);
  }
  return r;
}

std::optional<double> bits_per_byte(const ResolvedData& data, double nats_per_token) {
  if (!data.val_tokens || !data.val_bytes || *data.val_bytes <= 0) return std::nullopt;
  return nats_per_token / std::log(2.0) * *data.val_tokens / *data.val_bytes;
}

}  // namespace gtron
