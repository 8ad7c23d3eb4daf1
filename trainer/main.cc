// gtron: the command-line trainer. Subcommands: train, eval, sample, logits, prepare, tokenizer
// (train, encode), export, import, print-config.
// Every user error (flags, config, data, checkpoint) prints one clear message and exits with code 2
// before any work starts; internal invariants abort.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>

#include "parallel/store.h"
#include "trainer/config.h"
#include "trainer/data/text_source.h"
#include "trainer/hf_gpt2.h"
#include "trainer/io/checkpoint.h"
#include "trainer/io/checkpoint_io.h"
#include "trainer/io/safetensors.h"
#include "trainer/preflight.h"
#include "trainer/prepare.h"
#include "trainer/sample.h"
#include "trainer/text/tokenizer_commands.h"
#include "trainer/threads.h"
#include "trainer/train.h"

namespace gtron {
namespace {

struct Options {
  std::string config;
  std::vector<std::string> sets;
  std::string out;
  bool resume = false;
  bool overwrite = false;  // train --overwrite: delete the earlier run's checkpoints and metrics
  std::string init;        // train --init: a checkpoint's weights start the run
  std::string checkpoint;
  std::string hf;                       // export --hf OUT, import --hf DIR
  std::vector<std::string> token_rows;  // logits --tokens "1,2,3" (one per sequence)
  SampleArgs sample;
  int64_t prepare_tokens = 2000000;  // prepare --synthetic: train tokens
  std::vector<std::string> text;
  std::string tokenizer;
  std::string doc_separator;
  std::string text_field = "text";  // prepare --text-field: JSON lines' text member
  int64_t max_docs = 0;             // prepare --max-docs (0 = all)
  int threads = 0;                  // prepare --threads (0 = every hardware thread)
  std::string synthetic;
  double val_fraction = 0.1;
  int64_t order = 2;
  int64_t vocab = 64;
  double alpha = 0.2;
  double bigram = 0.0;           // prepare --synthetic: first-order weight (0 = pure order K)
  uint64_t prepare_seed = 1234;  // same default as data.synthetic.seed
  int64_t val_tokens = 100000;
  bool markdown = false;
  TokenizerTrainArgs tok_train;
  TokenizerEncodeArgs tok_encode;
};

Config load(const Options& o, int world_size = 0) {
  std::vector<std::string> sets = o.sets;
  if (!o.out.empty()) sets.push_back("train.out_dir=" + o.out);
  return load_config(o.config, sets, world_size);
}

// Note [preflight] in trainer/preflight.h: every check before any work.
int cmd_train(const Options& o) {
  const parallel::DistEnv env = parallel::dist_env_from_environment();
  const Config cfg = load(o, env.world_size);
  preflight_train(cfg, {o.resume, o.overwrite, o.init}, env.world_size, env.rank);
  return run_training(cfg, o.resume, nullptr, o.init);
}

// The checkpoint's config unless --config FILE (which must match its model) is given.
Config checkpoint_config(const char* command, const Options& o) {
  verify_checkpoint_dir(o.checkpoint);
  return checkpoint_command_config(command, o.checkpoint, o.config, o.sets);
}

int cmd_eval(const Options& o) {
  Config cfg = checkpoint_config("eval", o);
  check_cpu_memory(cfg, /*training=*/false, 0, "gtron eval of this checkpoint");
  ResolvedData data = resolve_data(cfg);
  GPTConfig gc = gpt_config(cfg);
  gc.document_start = data.document_start;  // evaluated as trained (data.document_masking)
  GPT model(gc, DType::kF32, Device::cpu(), cfg.train.seed);
  load_model_weights(o.checkpoint, model);
  EvalResult r = evaluate(model, cfg, data.val_glob);
  std::printf("{\"checkpoint\": \"%s\", \"val_main_loss\": %.6f, \"val_mtp_losses\": [",
              o.checkpoint.c_str(), r.main_loss);
  for (size_t k = 0; k < r.mtp_losses.size(); ++k) {
    std::printf("%s%.6f", k ? ", " : "", r.mtp_losses[k]);
  }
  std::printf("], \"tokens\": %ld", static_cast<long>(r.tokens));
  if (const auto bpb = bits_per_byte(data, r.main_loss)) {
    std::printf(", \"val_bits_per_byte\": %.6f", *bpb);
  }
  std::printf("}\n");
  return kExitOk;
}

int cmd_sample(const Options& o) {
  Config cfg = checkpoint_config("sample", o);
  // The key/value caches: 2 × (blocks + depths) × batch × context × the cached width (GPT-2: C;
  // the llama family: NKV·HS) floats at most.
  const GPTConfig gc = gpt_config(cfg);
  const double kv_width = gc.llama() ? static_cast<double>(gc.llama_dims().NKV * gc.llama_dims().HS)
                                     : static_cast<double>(cfg.model.n_embd);
  const double cache = 8.0 * static_cast<double>(cfg.model.n_layer + cfg.mtp.depth) *
                       static_cast<double>(o.sample.batch) *
                       static_cast<double>(cfg.model.context_length) * kv_width;
  check_cpu_memory(cfg, /*training=*/false, cache,
                   str_cat("gtron sample --batch ", o.sample.batch, " of this checkpoint"));
  GPT model(gc, DType::kF32, sample_device(o.sample.device), cfg.train.seed);
  load_model_weights(o.checkpoint, model);
  std::optional<Tokenizer> tokenizer = read_checkpoint_tokenizer(o.checkpoint);
  run_sample(model, o.sample, std::cout, std::cerr, tokenizer ? &*tokenizer : nullptr);
  return kExitOk;
}

// "1,2,3" (commas or spaces) -> ids, each in [0, V).
std::vector<int32_t> parse_token_row(const std::string& row, int64_t V) {
  std::string text = row;
  for (char& c : text) c = c == ',' ? ' ' : c;
  std::istringstream in(text);
  std::vector<int32_t> ids;
  std::string word;
  while (in >> word) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || v < 0 || v >= V)
      throw UserError(str_cat("gtron logits: --tokens '", row, "': '", word,
                              "' is not a token id in [0, ", V, ") (model.vocab_size)"));
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

int cmd_logits(const Options& o) {
  Config cfg = checkpoint_config("logits", o);
  const int64_t V = cfg.model.vocab_size;
  std::vector<int32_t> ids;
  int64_t T = 0;
  for (const std::string& row : o.token_rows) {
    std::vector<int32_t> r = parse_token_row(row, V);
    if (T == 0) T = static_cast<int64_t>(r.size());
    if (r.empty() || static_cast<int64_t>(r.size()) != T || T > cfg.model.context_length)
      throw UserError(str_cat("gtron logits: every --tokens row needs the same length, between 1 ",
                              "and model.context_length = ", cfg.model.context_length, "; '", row,
                              "' has ", r.size(), " tokens, the first row ", T));
    ids.insert(ids.end(), r.begin(), r.end());
  }
  const int64_t B = static_cast<int64_t>(o.token_rows.size());
  // The logits of every row: B × T × padded vocab floats, twice (the model's and the cut copy).
  check_cpu_memory(cfg, /*training=*/false,
                   8.0 * static_cast<double>(B * T) * static_cast<double>(cfg.model.padded_vocab()),
                   str_cat("gtron logits of ", B, " rows of ", T, " tokens"));
  GPT model(gpt_config(cfg), DType::kF32, Device::cpu(), cfg.train.seed);
  load_model_weights(o.checkpoint, model);
  const Tensor tokens = Tensor::from_ints(ids, {B, T});
  const Tensor all = model.logits(tokens).view({B * T, cfg.model.padded_vocab()});
  Tensor logits = Tensor::empty({B, T, V}, DType::kF32);  // the padded columns cut off
  for (int64_t i = 0; i < B * T; ++i) {
    std::memcpy(logits.data<float>() + i * V, all.data<float>() + i * all.dim(1),
                static_cast<size_t>(V) * sizeof(float));
  }
  write_safetensors(o.out, {{"tokens", tokens}, {"logits", logits}},
                    {{"checkpoint", o.checkpoint}});
  std::printf("{\"out\": \"%s\", \"logits\": [%ld, %ld, %ld]}\n", o.out.c_str(),
              static_cast<long>(B), static_cast<long>(T), static_cast<long>(V));
  return kExitOk;
}

int cmd_export(const Options& o) {
  export_hf(o.checkpoint, o.hf, o.config, o.sets);
  std::printf("exported %s to %s (transformers directory)\n", o.checkpoint.c_str(), o.hf.c_str());
  return kExitOk;
}

int cmd_import(const Options& o) {
  std::printf("%s\n", import_hf({o.hf, o.out, o.config, o.sets}).c_str());
  return kExitOk;
}

// The one plain text file the byte-level tokenizer reads (a glob may name it).
std::string byte_level_text_file(const std::vector<std::string>& args) {
  const std::vector<TextInput> inputs = expand_text_inputs(args);
  if (inputs.size() != 1 || inputs[0].format != TextFormat::kText ||
      inputs[0].compression != Compression::kNone) {
    throw UserError(
        str_cat("gtron prepare: the byte-level tokenizer takes one plain text file; --text gives ",
                inputs.size(), " input(s), the first '", inputs[0].path,
                "'. Hint: pass --tokenizer tokenizer.json to prepare several files, JSON lines or "
                "compressed files"));
  }
  return inputs[0].path;
}

int cmd_prepare(const Options& o) {
  if (o.out.empty()) throw UserError("gtron prepare: --out DIR is required");
  if (!o.text.empty() && !o.synthetic.empty()) {
    throw UserError("gtron prepare: give either --text FILE or --synthetic markov, not both");
  }
  if (!o.text.empty() && !o.tokenizer.empty()) {
    TokenizedTextOptions t;
    t.files = o.text;
    t.tokenizer = o.tokenizer;
    t.doc_separator = o.doc_separator;
    t.text_field = o.text_field;
    t.max_docs = o.max_docs;
    t.threads = o.threads;
    t.val_fraction = o.val_fraction;
    prepare_tokenized_text(t, o.out);
  } else if (!o.tokenizer.empty() || !o.doc_separator.empty()) {
    throw UserError("gtron prepare: --tokenizer and --doc-separator go with --text FILE...");
  } else if (!o.text.empty() && (o.max_docs > 0 || o.text_field != "text")) {
    throw UserError(
        "gtron prepare: --max-docs and --text-field go with --tokenizer (the byte-level tokenizer "
        "reads one text file whole)");
  } else if (!o.text.empty()) {
    prepare_text(byte_level_text_file(o.text), o.out, o.val_fraction);
  } else if (o.synthetic == "markov") {
    prepare_synthetic_markov(static_cast<int>(o.order), static_cast<int>(o.vocab), o.alpha,
                             o.prepare_tokens, o.val_tokens, o.prepare_seed, o.out, o.bigram);
  } else if (!o.synthetic.empty()) {
    throw UserError("gtron prepare: --synthetic \"" + o.synthetic +
                    "\": the only synthetic source is \"markov\"");
  } else {
    throw UserError("gtron prepare: nothing to prepare. Hint: --text FILE or --synthetic markov");
  }
  std::printf("prepared %s (see %s/meta.json)\n", o.out.c_str(), o.out.c_str());
  return kExitOk;
}

int cmd_print_config(const Options& o) {
  if (o.markdown) {
    std::cout << config_markdown_table();
    return kExitOk;
  }
  Config cfg = o.config.empty() ? default_config() : load(o);
  std::cout << resolved_json(cfg);
  return kExitOk;
}

int run(int argc, char** argv) {
  // A write to a dead peer's socket (Gloo, the store) fails with EPIPE and is reported as that
  // peer's failure, instead of killing this rank with SIGPIPE (exit 141, no message).
  std::signal(SIGPIPE, SIG_IGN);
  apply_default_cpu_threads();  // OMP_NUM_THREADS unset: trainer/threads.h
  Options o;
  CLI::App app{"gtron: a small C++/CUDA trainer for GPT models with GTP and MTP"};
  app.require_subcommand(1);
  app.option_defaults()->always_capture_default();

  auto* train = app.add_subcommand("train", "Train a model from a JSON config");
  train->add_option("--config", o.config, "JSON config file")->required();
  train->add_option("--set", o.sets, "Override a config key: key.path=value (repeatable)");
  train->add_option("--out", o.out, "Run directory (overrides train.out_dir)");
  train->add_flag("--resume", o.resume,
                  "Continue from the newest complete checkpoint (none: start at step 0)");
  train->add_flag("--overwrite", o.overwrite,
                  "Delete the earlier run's checkpoints and metrics in the run folder first, then "
                  "start at step 0 (without it or --resume, such a folder is refused)");
  train->add_option("--init", o.init,
                    "Start from a checkpoint's weights (fresh optimizer, step 0; with --resume: "
                    "only when there is nothing to resume)");

  auto* eval =
      app.add_subcommand("eval", "Validation loss (and per-depth MTP losses) of a checkpoint");
  eval->add_option("--config", o.config,
                   "JSON config file (default: the checkpoint's own, from trainer_state.json)");
  eval->add_option("--checkpoint", o.checkpoint, "Checkpoint directory (…/step_00000100)")
      ->required();
  eval->add_option("--set", o.sets, "Override a config key: key.path=value (repeatable)");

  auto* sample = app.add_subcommand(
      "sample", "Generate from a checkpoint (KV cache; MTP self-speculative decoding)");
  SampleArgs& sa = o.sample;
  sample->add_option("--checkpoint", o.checkpoint, "Checkpoint directory")->required();
  sample->add_option("--config", o.config,
                     "JSON config file (default: the checkpoint's own); its model must match");
  sample->add_option("--set", o.sets, "Override a config key: key.path=value (repeatable)");
  auto* prompt = sample->add_option("--prompt", sa.prompt,
                                    "Prompt text (through the checkpoint's tokenizer, else bytes)");
  auto* prompt_ids =
      sample->add_option("--prompt-ids", sa.prompt_ids, "Prompt token ids, e.g. 1,2,3 (any model)");
  sample->add_option("--tokens", sa.tokens, "New tokens per row")->check(CLI::Range(1, 1 << 20));
  sample->add_option("--temperature", sa.temperature, "Softmax temperature (0 = greedy)")
      ->check(CLI::Range(0.0, 100.0));
  sample->add_option("--top-k", sa.top_k, "Sample among the k most likely tokens (0 = all)")
      ->check(CLI::NonNegativeNumber);
  sample->add_option("--top-p", sa.top_p, "Sample from the smallest set of mass >= P (1 = all)");
  sample->add_option("--seed", sa.seed, "Sampling seed (row b of a batch uses stream b)");
  sample->add_option("--batch", sa.batch, "Decode the prompt N times together")
      ->check(CLI::Range(1, 1 << 16));
  sample->add_flag("--speculative", sa.speculative,
                   "Draft with the MTP depths, verify in one pass");
  sample->add_flag("--print-ids", sa.print_ids, "Print token ids instead of text");
  sample->add_flag("--recompute", sa.recompute,
                   "Recompute the whole context for every token (the slow reference path)");
  sample->add_flag("--no-graphs", sa.no_graphs,
                   "CUDA: run every decoding step eagerly through the training ops");
  sample->add_flag("--warmup", sa.warmup,
                   "Generate 8 tokens untimed first (benchmarks: keeps one-time start-up costs "
                   "out of the stats line)");
  sample->add_option("--device", sa.device, "cpu, or cuda (GPU 0)");
  sample->add_option("--dtype", sa.dtype,
                     "Weights and activations: f32 (the reference), or bf16 (--device cuda)");

  auto* logits = app.add_subcommand(
      "logits", "Next-token logits (fp32, CPU) of a checkpoint for given tokens, as safetensors");
  logits->add_option("--checkpoint", o.checkpoint, "Checkpoint directory")->required();
  logits->add_option("--config", o.config,
                     "JSON config file (default: the checkpoint's own); its model must match");
  logits->add_option("--set", o.sets, "Override a config key: key.path=value (repeatable)");
  logits->add_option("--tokens", o.token_rows, "One sequence of token ids, e.g. 1,2,3 (repeatable)")
      ->required();
  logits->add_option("--out", o.out, "Output safetensors file (tokens [B, T], logits [B, T, V])")
      ->required();

  auto* exp = app.add_subcommand(
      "export", "Write a checkpoint as a transformers directory (GPT-2 or llama family)");
  exp->add_option("--checkpoint", o.checkpoint, "Checkpoint directory")->required();
  exp->add_option("--hf", o.hf, "Output directory (must not exist)")->required();
  exp->add_option("--config", o.config,
                  "JSON config file recorded in gtron.json (default: the checkpoint's own); its "
                  "model must match");
  exp->add_option("--set", o.sets, "Override a config key: key.path=value (repeatable)");

  auto* imp = app.add_subcommand(
      "import", "Read a transformers directory (GPT-2 or llama family) into a gtron checkpoint");
  imp->add_option("--hf", o.hf, "transformers directory (config.json, model.safetensors)")
      ->required();
  imp->add_option("--out", o.out, "Checkpoint directory to write (must not exist)")->required();
  imp->add_option("--config", o.config,
                  "gtron config for the keys config.json lacks (default: the export's gtron.json, "
                  "else the defaults)");
  imp->add_option("--set", o.sets, "Override a config key: key.path=value (repeatable)");

  auto* prepare = app.add_subcommand(
      "prepare", "Write token shards: text (bytes or BPE) or a synthetic source");
  prepare->add_option("--text", o.text,
                      "Text inputs: files, directories or globs; .txt, .jsonl, .jsonl.gz, "
                      ".jsonl.zst by name (byte-level: one text file)");
  prepare->add_option("--tokenizer", o.tokenizer, "tokenizer.json to encode the text with");
  prepare->add_option("--doc-separator", o.doc_separator,
                      "With --tokenizer: a line that separates documents in text files (e.g. %)");
  prepare->add_option("--text-field", o.text_field,
                      "With --tokenizer: the member of each JSON line that holds the text");
  prepare
      ->add_option("--max-docs", o.max_docs,
                   "With --tokenizer: read at most N documents (0 = all), for quick trials")
      ->check(CLI::NonNegativeNumber);
  prepare
      ->add_option("--threads", o.threads,
                   "With --tokenizer: worker threads (0 = every hardware thread); the shards are "
                   "the same for any count")
      ->check(CLI::Range(0, 4096));
  prepare->add_option("--val-fraction", o.val_fraction, "Fraction of the text for validation");
  prepare->add_option("--synthetic", o.synthetic, "Synthetic source: markov");
  prepare->add_option("--order", o.order, "Markov order K")->check(CLI::PositiveNumber);
  prepare->add_option("--vocab", o.vocab, "Markov vocabulary V")->check(CLI::Range(2, 1 << 20));
  prepare->add_option("--alpha", o.alpha, "Dirichlet concentration of transition rows");
  prepare
      ->add_option("--bigram", o.bigram,
                   "Weight of a first-order part mixed into each row (0 = pure order K)")
      ->check(CLI::Range(0.0, 0.999999));
  prepare->add_option("--tokens", o.prepare_tokens, "Train tokens (synthetic)")
      ->check(CLI::PositiveNumber);
  prepare->add_option("--val-tokens", o.val_tokens, "Validation tokens (synthetic)")
      ->check(CLI::PositiveNumber);
  prepare->add_option("--seed", o.prepare_seed, "Seed of the synthetic source");
  prepare->add_option("--out", o.out, "Output directory")->required();

  auto* tokenizer = app.add_subcommand("tokenizer", "Byte-level BPE tokenizers (tokenizer.json)");
  tokenizer->require_subcommand(1);
  auto* tok_train = tokenizer->add_subcommand("train", "Train a tokenizer on text files");
  TokenizerTrainArgs& tt = o.tok_train;
  tok_train
      ->add_option("--text", tt.text,
                   "Text inputs: files, directories or globs; .txt, .jsonl, .jsonl.gz, .jsonl.zst "
                   "by name (a text file is one document)")
      ->required();
  tok_train->add_option("--vocab-size", tt.vocab_size, "Tokens: 256 bytes + merges + specials")
      ->required();
  tok_train->add_option("--out", tt.out, "tokenizer.json to write")->required();
  tok_train->add_option("--special", tt.specials, "A special token, kept whole (repeatable)");
  tok_train->add_option("--pattern", tt.pattern,
                        "Pre-tokenization split pattern: gpt2 (default), llama3 or qwen2");
  tok_train->add_option("--doc-separator", tt.doc_separator,
                        "A line that separates documents inside a text file (e.g. %)");
  tok_train->add_option("--text-field", tt.text_field,
                        "The member of each JSON line that holds the text");
  tok_train
      ->add_option("--max-docs", tt.max_docs,
                   "Read at most N documents (0 = all), for quick trials")
      ->check(CLI::NonNegativeNumber);
  tok_train
      ->add_option("--threads", tt.threads,
                   "Worker threads (0 = every hardware thread); the tokenizer is the same for any "
                   "count")
      ->check(CLI::Range(0, 4096));
  tok_train->add_option("--val-fraction", tt.val_fraction,
                        "Leave out the validation split `prepare --val-fraction` makes");
  auto* tok_encode = tokenizer->add_subcommand("encode", "Encode text files; print the speed");
  tok_encode->add_option("--tokenizer", o.tok_encode.tokenizer, "tokenizer.json")->required();
  tok_encode->add_option("--text", o.tok_encode.text, "Text files")->required();
  tok_encode->add_option("--ids-out", o.tok_encode.ids_out, "Write the ids here (one line a file)");

  auto* print = app.add_subcommand("print-config", "Print the resolved config with every default");
  print->add_option("--config", o.config, "JSON config file (none = all defaults)");
  print->add_option("--set", o.sets, "Override a config key: key.path=value (repeatable)");
  print->add_flag("--markdown", o.markdown, "Print the table of every key (docs/configuration.md)");

  // CLI11 reports a mistyped subcommand only as "a subcommand is required": name it instead.
  const std::string first = argc > 1 ? argv[1] : "";
  const bool known = first == "train" || first == "eval" || first == "sample" ||
                     first == "logits" || first == "prepare" || first == "tokenizer" ||
                     first == "export" || first == "import" || first == "print-config";
  if (!first.empty() && first[0] != '-' && !known) {
    std::fprintf(stderr,
                 "gtron: error: unknown subcommand '%s'; expected one of train, eval, sample, "
                 "logits, prepare, tokenizer, export, import, print-config (see gtron --help)\n",
                 argv[1]);
    return kExitUserError;
  }
  const std::string second = argc > 2 ? argv[2] : "";
  if (first == "tokenizer" && !second.empty() && second[0] != '-' && second != "train" &&
      second != "encode") {
    std::fprintf(stderr,
                 "gtron: error: unknown subcommand 'tokenizer %s'; expected tokenizer train or "
                 "tokenizer encode\n",
                 argv[2]);
    return kExitUserError;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUserError;
  }
  try {
    if (*train) return cmd_train(o);
    if (*eval) return cmd_eval(o);
    if (*sample) {
      o.sample.prompt_given = prompt->count() > 0;
      o.sample.prompt_ids_given = prompt_ids->count() > 0;
      return cmd_sample(o);
    }
    if (*logits) return cmd_logits(o);
    if (*prepare) return cmd_prepare(o);
    if (*exp) return cmd_export(o);
    if (*imp) return cmd_import(o);
    if (*tok_train) return tokenizer_train_command(o.tok_train);
    if (*tok_encode) return tokenizer_encode_command(o.tok_encode);
    return cmd_print_config(o);
  } catch (const UserError& e) {
    std::fprintf(stderr, "gtron: error: %s\n", e.what());
    return kExitUserError;
  } catch (const std::exception& e) {
    // Not the user's input: a failed collective (a peer rank died), out of memory, I/O.
    std::fprintf(stderr, "gtron: fatal: %s\n", e.what());
    return 1;
  }
}

}  // namespace
}  // namespace gtron

int main(int argc, char** argv) { return gtron::run(argc, argv); }
