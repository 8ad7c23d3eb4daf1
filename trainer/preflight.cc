#include "trainer/preflight.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "model/check.h"
#include "model/device.h"
#include "trainer/data/markov.h"
#include "trainer/data/sampler.h"
#include "trainer/data/shards.h"
#include "trainer/io/checkpoint.h"
#include "trainer/io/checkpoint_io.h"
#include "trainer/text/tokenizer.h"
#include "trainer/train.h"

namespace gtron {
namespace {

namespace fs = std::filesystem;

constexpr char kTmpPrefix[] = ".tmp-step_";  // Note [checkpoint atomicity] in checkpoint_io.h
constexpr char kOldPrefix[] = ".old-step_";

bool starts_with(const std::string& s, const char* prefix) {
  return s.compare(0, std::strlen(prefix), prefix) == 0;
}

// Re-throws a shard or tokenizer error with the config key in front, so the message names both
// the key and the file.
template <typename F>
void with_key(const std::string& key, const std::string& value, F&& check) {
  try {
    check();
  } catch (const UserError& e) {
    throw UserError(str_cat(key, " = \"", value, "\": ", e.what()));
  }
}

// Train and validation shards exactly as the run will read them, and the data's tokenizer.
// Synthetic data (data.train "") is written by the run itself and checked by the config.
void check_data(const Config& cfg) {
  const SyntheticDataConfig& s = cfg.data.synthetic;
  const int64_t V = cfg.model.vocab_size, T = cfg.train.seq_len;
  if (!cfg.data.train.empty()) {
    const ResolvedData d = resolve_data(cfg);  // meta.json's vocabulary; writes nothing here
    with_key("data.train", cfg.data.train, [&] {
      ShardSet train(d.train_glob, V);
      SequenceSampler windows(train, T);  // every shard holds one window
    });
    if (!d.tokenizer_path.empty()) {
      with_key("data.train", cfg.data.train,
               [&] { Tokenizer::from_json_text(read_file(d.tokenizer_path), d.tokenizer_path); });
    }
  }
  if (!cfg.data.val.empty() && cfg.data.val != cfg.data.train) {
    with_key("data.val", cfg.data.val, [&] {
      ShardSet val(cfg.data.val, V);
      EvalWindows windows(val, T);  // at least one shard holds one window
    });
  }
  // The synthetic source's transition table (trainer/data/markov.h), before the run folder exists.
  if (cfg.data.train.empty() &&
      std::pow(static_cast<double>(s.vocab), static_cast<double>(s.order + 1)) >
          static_cast<double>(kMarkovMaxTableEntries)) {
    throw UserError(str_cat("config error: data.synthetic.order = ", s.order,
                            " with data.synthetic.vocab = ", s.vocab, ": vocab^(order+1) ",
                            "transition entries exceed the limit ", kMarkovMaxTableEntries,
                            ". Hint: lower data.synthetic.order or data.synthetic.vocab"));
  }
  // data.synthetic.tokens are written as one shard (at most INT32_MAX tokens, write_shard).
  const int64_t most = std::numeric_limits<int32_t>::max();
  if (cfg.data.train.empty() && (s.tokens > most || s.val_tokens > most)) {
    const bool train = s.tokens > most;
    throw UserError(str_cat("config error: data.synthetic.", train ? "tokens" : "val_tokens", " = ",
                            train ? s.tokens : s.val_tokens, ": must be <= ", most,
                            " (one shard). Hint: the default is ", train ? "2000000" : "100000"));
  }
}

// `dir` can hold the run's files: an existing folder gets a probe file created and removed; a
// missing one needs its nearest existing ancestor to be a folder that takes the probe, since the
// run will create it there. The probe is a real write, so it fails for root too where writes fail
// (a read-only mount, a path through a regular file), not only where the mode bits say so.
// Nothing is left behind.
void check_writable_folder(const std::string& key, const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.empty()) p = ".";
  std::error_code ec;
  fs::path existing = p;
  while (!fs::exists(existing, ec)) {
    if (!existing.has_parent_path() || existing == existing.parent_path()) {
      existing = ".";  // a relative path's first component: created in the current folder
      break;
    }
    existing = existing.parent_path();
  }
  if (!fs::is_directory(existing, ec)) {
    throw UserError(str_cat(key, " = \"", dir, "\": cannot create this folder, '",
                            existing.string(),
                            "' exists and is not a folder. Hint: choose a path under a folder"));
  }
  const std::string probe = str_cat(existing.string(), "/.gtron-write-probe-", ::getpid());
  const int fd = ::open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    throw UserError(str_cat(key, " = \"", dir, "\": cannot write in '", existing.string(), "' (",
                            std::strerror(err), "). Hint: choose a writable folder, e.g. --out ",
                            "runs/NAME or --set checkpoint.dir=..."));
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

// What an earlier run left in this run's folders: its checkpoints and its metrics file.
std::vector<std::string> earlier_run(const Config& cfg) {
  std::vector<std::string> found;
  const std::vector<CheckpointEntry> ckpts = list_checkpoints(checkpoint_dir(cfg));
  if (!ckpts.empty()) {
    found.push_back(str_cat(ckpts.size(), " checkpoint", ckpts.size() == 1 ? "" : "s", " in '",
                            checkpoint_dir(cfg), "' (newest ", ckpts.back().path, ")"));
  }
  std::error_code ec;
  if (fs::exists(metrics_path(cfg), ec)) found.push_back("'" + metrics_path(cfg) + "'");
  return found;
}

std::string joined(const std::vector<std::string>& parts) {
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? " and " : "") + parts[i];
  return s;
}

// The newest checkpoint under `root` that verifies, without the console reports of
// find_latest_complete() (the Run reports them when it loads).
std::optional<std::string> newest_good_checkpoint(const std::string& root) {
  const std::vector<CheckpointEntry> all = list_checkpoints(root);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      verify_checkpoint_dir(it->path);
      return it->path;
    } catch (const UserError&) {
    }
  }
  return std::nullopt;
}

Config config_of_checkpoint(const std::string& dir, const std::vector<std::string>& sets = {}) {
  const TrainerState st = read_trainer_state(dir);
  return config_from_json_text(st.config_json, sets, dir + "/trainer_state.json");
}

void check_matches(const std::string& flag, const std::string& dir, const Config& cfg,
                   const std::string& config_name) {
  const std::string diff = model_difference(config_of_checkpoint(dir), cfg);
  if (diff.empty()) return;
  throw UserError(str_cat(flag, ": checkpoint '", dir, "' does not match ", config_name, ": ", diff,
                          ". Hint: use the config the checkpoint was trained with (its ",
                          "trainer_state.json holds it), or change that key"));
}

// Removes what the flags and the checkpoint protocol say is garbage (rank 0, after every check).
void clean_up(const Config& cfg, const TrainFlags& flags) {
  const std::string root = checkpoint_dir(cfg);
  std::error_code ec;
  if (flags.overwrite) {
    const std::vector<std::string> earlier = earlier_run(cfg);
    for (const CheckpointEntry& e : list_checkpoints(root)) {
      fs::remove_all(e.path, ec);
      if (ec) throw UserError(str_cat("--overwrite: cannot delete '", e.path, "': ", ec.message()));
    }
    if (fs::exists(metrics_path(cfg), ec) && !fs::remove(metrics_path(cfg), ec)) {
      throw UserError(
          str_cat("--overwrite: cannot delete '", metrics_path(cfg), "': ", ec.message()));
    }
    if (!earlier.empty())
      std::printf("--overwrite: deleted the earlier run's %s; starting at step 0\n",
                  joined(earlier).c_str());
  }
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    bool stale = starts_with(name, kTmpPrefix);  // never renamed into place: incomplete
    if (starts_with(name, kOldPrefix)) {
      // A replaced checkpoint moved aside; garbage only once its successor is in place.
      const std::string step =
          name.substr(std::strlen(kOldPrefix), name.rfind('-') - std::strlen(kOldPrefix));
      std::error_code e2;
      stale = flags.overwrite || fs::exists(root + "/step_" + step, e2);
    }
    if (!stale) continue;
    std::error_code e3;
    fs::remove_all(it->path(), e3);
    std::printf(
        "removed leftover temporary checkpoint folder '%s' (an interrupted save, "
        "incomplete)%s\n",
        it->path().string().c_str(), e3 ? " FAILED" : "");
  }
}

// "12.3" style: three significant digits, no exponent below 1e15.
std::string short_number(double x) {
  char buf[48];
  std::snprintf(buf, sizeof buf, x < 1e15 ? "%.3g" : "%.2e", x);
  if (x >= 1000 && x < 1e15) std::snprintf(buf, sizeof buf, "%.0f", x);
  return buf;
}

std::string gib(double bytes) { return short_number(bytes / (1024.0 * 1024.0 * 1024.0)); }

// Physical memory, or the cgroup's limit when lower.
double machine_memory_bytes() {
  double bytes =
      static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream f(path);
    double limit = 0;
    if (f >> limit && limit > 0 && limit < bytes) bytes = limit;
  }
  return bytes;
}

}  // namespace

std::string model_difference(const Config& a, const Config& b) {
  const auto differ = [](const char* key, auto x, auto y) -> std::string {
    if (x == y) return "";
    return str_cat(key, ": checkpoint ", x, ", config ", y);
  };
  std::string d;
  if (a.model.padded_vocab() != b.model.padded_vocab())
    d = differ("model.vocab_size", a.model.vocab_size, b.model.vocab_size);
  if (d.empty()) d = differ("model.context_length", a.model.context_length, b.model.context_length);
  if (d.empty()) d = differ("model.n_layer", a.model.n_layer, b.model.n_layer);
  if (d.empty()) d = differ("model.n_head", a.model.n_head, b.model.n_head);
  if (d.empty()) d = differ("model.n_embd", a.model.n_embd, b.model.n_embd);
  if (d.empty() && a.model.tied_embeddings != b.model.tied_embeddings)
    d = str_cat("model.tied_embeddings: checkpoint ", a.model.tied_embeddings ? "true" : "false",
                ", config ", b.model.tied_embeddings ? "true" : "false");
  if (d.empty() && a.model.arch != b.model.arch)
    d = str_cat("model.arch: checkpoint ", to_string(a.model.arch), ", config ",
                to_string(b.model.arch));
  if (d.empty()) d = differ("model.n_kv_head", a.model.n_kv_head, b.model.n_kv_head);
  if (d.empty()) d = differ("model.head_dim", a.model.head_dim, b.model.head_dim);
  if (d.empty())
    d = differ("model.intermediate_size", a.model.intermediate_size, b.model.intermediate_size);
  if (d.empty() && a.model.qk_norm != b.model.qk_norm)
    d = str_cat("model.qk_norm: checkpoint ", a.model.qk_norm ? "true" : "false", ", config ",
                b.model.qk_norm ? "true" : "false");
  if (d.empty() && a.model.qkv_bias != b.model.qkv_bias)
    d = str_cat("model.qkv_bias: checkpoint ", a.model.qkv_bias ? "true" : "false", ", config ",
                b.model.qkv_bias ? "true" : "false");
  if (d.empty()) d = differ("mtp.depth", a.mtp.depth, b.mtp.depth);
  return d;
}

Config checkpoint_command_config(const std::string& command, const std::string& checkpoint,
                                 const std::string& config_path,
                                 const std::vector<std::string>& sets) {
  if (config_path.empty() && sets.empty()) return config_of_checkpoint(checkpoint);
  const Config cfg =
      config_path.empty() ? config_of_checkpoint(checkpoint, sets) : load_config(config_path, sets);
  check_matches(str_cat("gtron ", command), checkpoint, cfg,
                config_path.empty() ? std::string("--set") : "--config " + config_path);
  return cfg;
}

void check_cpu_memory(const Config& cfg, bool training, double extra_bytes,
                      const std::string& what) {
  // In doubles: the keys have no upper bounds, and an int64 product could overflow.
  const double V = static_cast<double>(cfg.model.padded_vocab());
  const double C = static_cast<double>(cfg.model.n_embd);
  const double L = static_cast<double>(cfg.model.n_layer);
  const double Tmax = static_cast<double>(cfg.model.context_length);
  const double D = static_cast<double>(cfg.mtp.depth);
  double block = 12 * C * C + 13 * C;  // qkv, proj, fc, proj, two LayerNorms
  double positions = Tmax * C;
  if (cfg.model.arch == ModelArch::kLlama) {  // q|k|v, o, gate|up, down, two RMSNorms; no table
    const ModelConfig& m = cfg.model;
    const double NHq = static_cast<double>(m.n_head);
    const double NKV = static_cast<double>(m.n_kv_head > 0 ? m.n_kv_head : m.n_head);
    const double HS = static_cast<double>(m.head_dim > 0 ? m.head_dim : m.n_embd / m.n_head);
    const double F = static_cast<double>(
        m.intermediate_size > 0 ? m.intermediate_size : (8 * m.n_embd / 3 + 63) / 64 * 64);
    block = (NHq + 2 * NKV) * HS * C + NHq * HS * C + 3 * C * F + 2 * C;
    positions = 0;
  }
  double params = V * C * (cfg.model.tied_embeddings ? 1 : 2) + positions + L * block + 2 * C +
                  D * (2 * C + 2 * C * C + block);
  double bytes = 4 * params + extra_bytes;
  if (training) {
    // Gradients and AdamW's two moments beside the weights; the activations of one micro-batch
    // (a rough 20 C + the attention rows per token and block, and the logits with their
    // gradient): an estimate to refuse the impossible, not to plan memory.
    const double tokens = static_cast<double>(cfg.train.micro_batch * cfg.train.seq_len);
    const double T = static_cast<double>(cfg.train.seq_len);
    const double NH = static_cast<double>(cfg.model.n_head);
    bytes = 16 * params + 4 * tokens * (L + D) * (20 * C + 2 * NH * T) + 8 * tokens * V * (D + 1) +
            extra_bytes;
  }
  const double have = machine_memory_bytes();
  if (bytes <= have) return;
  throw UserError(
      str_cat(what, " needs about ", gib(bytes), " GiB of memory (", short_number(params / 1e6),
              "M parameters from model.vocab_size ", cfg.model.vocab_size, ", model.n_embd ",
              cfg.model.n_embd, ", model.n_layer ", cfg.model.n_layer, ", model.context_length ",
              cfg.model.context_length, ", mtp.depth ", cfg.mtp.depth,
              training ? str_cat("; train.micro_batch ", cfg.train.micro_batch, ", train.seq_len ",
                                 cfg.train.seq_len)
                       : std::string(),
              "), and this machine has ", gib(have), " GiB. Hint: a smaller model",
              training ? " or train.micro_batch" : "", ", or a machine with more memory"));
}

void preflight_train(const Config& cfg, const TrainFlags& flags, int world_size, int rank) {
  validate(cfg, world_size);
  if (flags.resume && flags.overwrite) {
    throw UserError(
        "--resume and --overwrite exclude each other: --resume continues the run in the folder, "
        "--overwrite deletes it and starts at step 0. Hint: pass one of them");
  }
  check_data(cfg);
  check_writable_folder("train.out_dir", cfg.train.out_dir);
  check_writable_folder("checkpoint.dir", checkpoint_dir(cfg));
  check_writable_folder("log.metrics_file", fs::path(metrics_path(cfg)).parent_path().string());
  const std::vector<std::string> earlier = earlier_run(cfg);
  if (!earlier.empty() && !flags.resume && !flags.overwrite) {
    throw UserError(str_cat("train.out_dir = \"", cfg.train.out_dir,
                            "\" holds an earlier run: ", joined(earlier),
                            ". Hint: --resume continues it, --overwrite deletes its checkpoints "
                            "and metrics and starts at step 0, or --out NEW_DIR starts elsewhere"));
  }
  std::optional<std::string> resume_from;
  if (flags.resume) {
    resume_from = newest_good_checkpoint(checkpoint_dir(cfg));
    if (resume_from) check_matches("--resume", *resume_from, cfg, "the config");
  }
  if (!flags.init.empty() && !resume_from) {
    verify_checkpoint_dir(flags.init);
    check_matches("--init", flags.init, cfg, "the config");
  }
  const bool cpu = cfg.train.device == DeviceChoice::kCpu ||
                   cfg.parallel.backend == CommBackend::kGloo || cuda_device_count() == 0;
  if (cpu) check_cpu_memory(cfg, /*training=*/true, 0, "this training run");
  if (rank == 0) clean_up(cfg, flags);
}

}  // namespace gtron
