#include "trainer/train.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "model/stream.h"
#include "trainer/checkpoint.h"
#include "trainer/checkpoint_io.h"
#include "trainer/metrics.h"
#include "trainer/optimizer.h"
#include "trainer/prepare.h"
#include "trainer/sampler.h"
#include "trainer/schedule.h"
#include "trainer/shards.h"

namespace gtron {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void make_dirs(const std::string& path) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!cur.empty() && ::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
        throw UserError("cannot create directory '" + cur + "' (" + std::strerror(errno) + ")");
      }
    }
    if (i < path.size()) cur += path[i];
  }
}

// The device runs use. The model's CUDA kernels land with the GPU backend issue; until then a
// run stays on CPU ("auto") or is refused ("cuda") with a clear message.
Device pick_device(const Config& cfg) {
  DeviceChoice d = resolve_device(cfg.train, /*cuda_available=*/false);
  if (cfg.train.device == DeviceChoice::kCuda || d == DeviceChoice::kCuda) {
    throw UserError(
        "train.device = \"cuda\": this build trains on CPU only (the CUDA kernels of the model "
        "are not in it yet). Hint: use train.device=cpu or auto.");
  }
  resolve_precision(cfg.train, DeviceChoice::kCpu);
  return Device::cpu();
}

std::vector<bool> decay_flags(const GPT& model, const OptimizerConfig& oc) {
  std::vector<bool> flags;
  for (const Parameter* p : model.parameters()) {
    const bool embedding =
        p->name == "wte.weight" || p->name == "wpe.weight" || p->name == "lm_head.weight";
    if (embedding) {
      flags.push_back(oc.decay_embeddings);
    } else if (!p->weight_decay) {
      flags.push_back(oc.decay_norms_and_biases);  // norms and biases
    } else {
      flags.push_back(true);
    }
  }
  return flags;
}

std::optional<double> meta_number(const std::string& meta_path, const char* key) {
  std::ifstream f(meta_path);
  if (!f) return std::nullopt;
  try {
    nlohmann::json j = nlohmann::json::parse(f);
    if (j.contains(key) && j[key].is_number()) return j[key].get<double>();
  } catch (const nlohmann::json::exception&) {
  }
  return std::nullopt;
}

std::string dirname_of(const std::string& glob) {
  const size_t slash = glob.rfind('/');
  return slash == std::string::npos ? "." : glob.substr(0, slash);
}

}  // namespace

GPTConfig gpt_config(const Config& cfg) {
  GPTConfig g;
  g.vocab_size = cfg.model.vocab_size;
  g.context_length = cfg.model.context_length;
  g.n_layer = static_cast<int>(cfg.model.n_layer);
  g.n_head = static_cast<int>(cfg.model.n_head);
  g.n_embd = cfg.model.n_embd;
  g.mtp_depth = static_cast<int>(cfg.mtp.depth);
  g.mtp_loss_weight = cfg.mtp.loss_weight;
  g.tied_embeddings = cfg.model.tied_embeddings;
  g.init_std = cfg.model.init_std;
  return g;
}

ResolvedData resolve_data(const Config& cfg) {
  ResolvedData d;
  if (cfg.data.train.empty()) {
    const SyntheticDataConfig& s = cfg.data.synthetic;
    const std::string dir = cfg.train.out_dir + "/data";
    make_dirs(cfg.train.out_dir);
    prepare_synthetic_markov(static_cast<int>(s.order), static_cast<int>(s.vocab), s.alpha,
                             s.tokens, s.val_tokens, s.seed, dir);
    d.train_glob = dir + "/train_*.bin";
    d.val_glob = cfg.data.val.empty() ? dir + "/val_*.bin" : cfg.data.val;
  } else {
    d.train_glob = cfg.data.train;
    d.val_glob = cfg.data.val.empty() ? cfg.data.train : cfg.data.val;
  }
  const std::string meta = dirname_of(d.train_glob) + "/meta.json";
  d.entropy_rate = meta_number(meta, "entropy_rate");
  d.unigram_entropy = meta_number(meta, "unigram_entropy");
  return d;
}

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

int run_training(const Config& cfg, bool resume, TrainSummary* summary) {
  validate(cfg, /*world_size=*/1);
  const Device device = pick_device(cfg);
  make_dirs(cfg.train.out_dir);
  const ResolvedData data = resolve_data(cfg);
  ShardSet train_shards(data.train_glob, cfg.model.vocab_size);
  SequenceSampler sampler(train_shards, cfg.train.seq_len);

  GPT model(gpt_config(cfg), DType::kF32, device, cfg.train.seed);
  AdamWHyper hyper{cfg.optimizer.beta1, cfg.optimizer.beta2, cfg.optimizer.eps,
                   cfg.optimizer.weight_decay};
  AdamW opt(model.parameters(), decay_flags(model, cfg.optimizer), hyper);
  Schedule sched{cfg.schedule.kind, cfg.optimizer.lr,          cfg.schedule.warmup_steps,
                 cfg.train.steps,   cfg.schedule.min_lr_ratio, cfg.schedule.wsd_decay_fraction};

  const std::string ckpt_root = checkpoint_dir(cfg);
  int64_t start = 0;  // steps already done
  if (resume) {
    if (auto dir = find_latest_complete(ckpt_root)) {
      TrainerState st = read_trainer_state(*dir);
      load_training_checkpoint(*dir, model, &opt);
      start = st.step;
      std::printf("resumed from %s (step %ld)\n", dir->c_str(), static_cast<long>(start));
    } else {
      std::printf("--resume: no complete checkpoint in %s; starting from step 0\n",
                  ckpt_root.c_str());
    }
  }

  const int64_t T = cfg.train.seq_len, mb = cfg.train.micro_batch;
  const int64_t accum = grad_accum_steps(cfg, 1);
  const int64_t tokens_per_step = cfg.train.global_batch * T;
  const double flops_per_step = model.flops_per_token(T) * static_cast<double>(tokens_per_step);
  const bool bf16 = false;
  std::printf(
      "gtron train: %ld parameters | L=%ld C=%ld NH=%ld V=%ld (padded %ld) T=%ld | MTP D=%ld\n",
      static_cast<long>(model.num_parameters()), static_cast<long>(cfg.model.n_layer),
      static_cast<long>(cfg.model.n_embd), static_cast<long>(cfg.model.n_head),
      static_cast<long>(cfg.model.vocab_size), static_cast<long>(cfg.model.padded_vocab()),
      static_cast<long>(T), static_cast<long>(cfg.mtp.depth));
  std::printf(
      "device %s, fp32 | batch %ld seqs = %ld micro x %ld accum | %ld tokens/step | MFU "
      "peak %s\n",
      device.str().c_str(), static_cast<long>(cfg.train.global_batch), static_cast<long>(mb),
      static_cast<long>(accum), static_cast<long>(tokens_per_step),
      describe_peak(device, bf16).c_str());
  std::printf("data: %s (%ld tokens)", data.train_glob.c_str(),
              static_cast<long>(train_shards.total_tokens()));
  if (data.entropy_rate) {
    std::printf(" | entropy floor %.4f nats/token, unigram %.4f", *data.entropy_rate,
                data.unigram_entropy.value_or(NAN));
  }
  std::printf("\n");

  MetricsWriter metrics;
  metrics.open(metrics_path(cfg), resume && start > 0);
  if (summary) {
    summary->first_step = start + 1;
    summary->entropy_rate = data.entropy_rate;
  }

  TrainerState state{start, opt.steps_taken(), cfg.train.seed, resolved_json(cfg)};
  const int64_t ckpt_every = cfg.checkpoint.every;
  const auto t_run = Clock::now();
  auto t_window = Clock::now();
  int64_t window_steps = 0;
  Tensor window = Tensor::empty({mb, T + 1}, DType::kI32);

  for (int64_t step = start; step < cfg.train.steps; ++step) {
    for (Parameter* p : model.parameters()) p->zero_grad();
    double loss = 0, main_loss = 0;
    std::vector<double> mtp(static_cast<size_t>(cfg.mtp.depth), 0.0);
    for (int64_t m = 0; m < accum; ++m) {
      sampler.sample(cfg.train.seed, step, m * mb, mb, window.data<int32_t>());
      GPTOutput out = model.forward(window);
      // Each micro-batch's loss is a mean over equal token counts: scaling by 1/accum makes the
      // gradient the mean over the global batch.
      backward(out.loss, 1.0 / static_cast<double>(accum));
      loss += out.loss.value().item() / accum;
      main_loss += out.main_loss.value().item() / accum;
      for (size_t k = 0; k < mtp.size(); ++k) mtp[k] += out.mtp_losses[k].value().item() / accum;
    }
    const double lr = sched.at(step);
    const double gnorm = opt.step(lr, cfg.optimizer.grad_clip);
    if (!std::isfinite(loss) || !std::isfinite(gnorm)) {
      auto last = find_latest_complete(ckpt_root);
      std::fprintf(stderr,
                   "gtron: non-finite %s at step %ld (loss %g, grad norm %g); stopping. Last good "
                   "checkpoint: %s. Hint: lower optimizer.lr or enable optimizer.grad_clip.\n",
                   std::isfinite(loss) ? "gradient" : "loss", static_cast<long>(step + 1), loss,
                   gnorm, last ? last->c_str() : "none");
      return kExitNonFinite;
    }
    if (summary) summary->losses.push_back(loss);
    ++window_steps;
    const int64_t done = step + 1;
    state.step = done;
    state.optimizer_steps = opt.steps_taken();

    if (done % cfg.log.every == 0 || done == cfg.train.steps) {
      const double dt = seconds_since(t_window);
      StepMetrics sm;
      sm.step = done;
      sm.total_steps = cfg.train.steps;
      sm.loss = loss;
      sm.main_loss = main_loss;
      sm.mtp_losses = mtp;
      sm.lr = lr;
      sm.grad_norm = gnorm;
      sm.tokens_per_s = static_cast<double>(window_steps * tokens_per_step) / dt;
      sm.mfu = flops_per_step * static_cast<double>(window_steps) / dt / peak_flops(device, bf16);
      sm.peak_mem_gib =
          static_cast<double>(allocator_for(device).stats().peak_allocated) / (1ull << 30);
      sm.elapsed_s = seconds_since(t_run);
      sm.eta_s =
          dt / static_cast<double>(window_steps) * static_cast<double>(cfg.train.steps - done);
      std::printf("%s\n", format_line(sm).c_str());
      std::fflush(stdout);
      metrics.write(format_json(sm));
      t_window = Clock::now();
      window_steps = 0;
    }
    if (cfg.train.eval_every > 0 && done % cfg.train.eval_every == 0 && done != cfg.train.steps) {
      EvalResult ev = evaluate(model, cfg, data.val_glob);
      std::printf("eval step %ld | val main loss %.4f\n", static_cast<long>(done), ev.main_loss);
    }
    if ((ckpt_every > 0 && done % ckpt_every == 0) || done == cfg.train.steps) {
      std::string dir = save_training_checkpoint(ckpt_root, model, &opt, state,
                                                 static_cast<int>(cfg.checkpoint.keep));
      std::printf("checkpoint %s\n", dir.c_str());
    }
  }

  EvalResult ev = evaluate(model, cfg, data.val_glob);
  std::printf("final: val main loss %.4f over %ld tokens", ev.main_loss,
              static_cast<long>(ev.tokens));
  for (size_t k = 0; k < ev.mtp_losses.size(); ++k) {
    std::printf(" | val mtp%zu %.4f", k + 1, ev.mtp_losses[k]);
  }
  if (data.entropy_rate) {
    std::printf(" | entropy floor %.4f | gap %.4f nats/token", *data.entropy_rate,
                ev.main_loss - *data.entropy_rate);
  }
  std::printf(" | %.1f s\n", seconds_since(t_run));
  if (summary) summary->val_loss = ev.main_loss;
  return kExitOk;
}

std::string sample_text(GPT& model, const std::string& prompt, int64_t tokens, double temperature,
                        int64_t top_k, uint64_t seed) {
  const GPTConfig& c = model.config();
  if (c.vocab_size < 256) {
    throw UserError(
        "gtron sample is for byte-level models (model.vocab_size >= 256); this "
        "checkpoint has vocab_size " +
        std::to_string(c.vocab_size));
  }
  std::vector<int32_t> ids;
  for (unsigned char ch : prompt) ids.push_back(ch);
  if (ids.empty()) ids.push_back('\n');
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
    out.push_back(static_cast<char>(next & 0xff));
  }
  return out;
}

}  // namespace gtron
