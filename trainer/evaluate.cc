// Evaluation and sampling, shared by `gtron train`, `gtron eval` and `gtron sample`.
#include <algorithm>
#include <cmath>
#include <random>

#include "trainer/sampler.h"
#include "trainer/shards.h"
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

std::string sample_text(GPT& model, const std::string& prompt, int64_t tokens, double temperature,
                        int64_t top_k, uint64_t seed, Tokenizer* tokenizer) {
  const GPTConfig& c = model.config();
  if (tokenizer != nullptr && c.vocab_size < tokenizer->vocab_size()) {
    throw UserError(str_cat("the checkpoint's model.vocab_size ", c.vocab_size,
                            " is below its tokenizer's ", tokenizer->vocab_size(), " tokens"));
  }
  if (tokenizer == nullptr && c.vocab_size < 256) {
    throw UserError(
        "gtron sample is for byte-level models (model.vocab_size >= 256); this "
        "checkpoint has vocab_size " +
        std::to_string(c.vocab_size));
  }
  std::vector<int32_t> ids;
  if (tokenizer != nullptr) {
    if (auto eot = tokenizer->special_id("<|endoftext|>")) ids.push_back(*eot);
    tokenizer->encode_append(prompt, &ids);
  } else {
    for (unsigned char ch : prompt) ids.push_back(ch);
  }
  if (ids.empty()) ids.push_back('\n');
  const size_t prompt_ids = ids.size();
  std::mt19937_64 rng(seed);
  std::string out;
  for (int64_t n = 0; n < tokens; ++n) {
    const int64_t T = std::min<int64_t>(static_cast<int64_t>(ids.size()), c.context_length);
    std::vector<int32_t> ctx(ids.end() - T, ids.end());
    Tensor logits = model.logits(Tensor::from_ints(ctx, {1, T}));
    const int64_t Vp = c.padded_vocab();
    std::vector<double> row = logits.rows(0, 1).view({T, Vp}).rows(T - 1, T).to_vector();
    row.resize(static_cast<size_t>(c.vocab_size));
    int32_t next = 0;
    if (temperature <= 0) {
      next = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    } else {
      std::vector<double> sorted = row;
      double cutoff = -INFINITY;
      if (top_k > 0 && top_k < static_cast<int64_t>(sorted.size())) {
        std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(),
                         std::greater<double>());
        cutoff = sorted[static_cast<size_t>(top_k - 1)];
      }
      const double mx = *std::max_element(row.begin(), row.end());
      std::vector<double> p(row.size());
      for (size_t i = 0; i < row.size(); ++i) {
        p[i] = row[i] < cutoff ? 0.0 : std::exp((row[i] - mx) / temperature);
      }
      std::discrete_distribution<int32_t> dist(p.begin(), p.end());
      next = dist(rng);
    }
    ids.push_back(next);
    if (tokenizer == nullptr) out.push_back(static_cast<char>(next & 0xff));
  }
  if (tokenizer != nullptr) {
    out = tokenizer->decode(ids.data() + prompt_ids, static_cast<int64_t>(ids.size() - prompt_ids));
  }
  return out;
}

}  // namespace gtron
