// gtron: the command-line trainer. Subcommands: train, eval, sample, prepare, tokenizer (train,
// encode), print-config.
// Every user error (flags, config, data, checkpoint) prints one clear message and exits with code 2
// before any work starts; internal invariants abort.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "trainer/checkpoint.h"
#include "trainer/checkpoint_io.h"
#include "trainer/config.h"
#include "trainer/prepare.h"
#include "trainer/tokenizer_commands.h"
#include "trainer/train.h"

namespace gtron {
namespace {

struct Options {
  std::string config;
  std::vector<std::string> sets;
  std::string out;
  bool resume = false;
  std::string checkpoint;
  std::string prompt;
  int64_t tokens = 256;              // sample: bytes to generate
  int64_t prepare_tokens = 2000000;  // prepare --synthetic: train tokens
  double temperature = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 1;
  std::vector<std::string> text;
  std::string tokenizer;
  std::string doc_separator;
  std::string synthetic;
  double val_fraction = 0.1;
  int64_t order = 2;
  int64_t vocab = 64;
  double alpha = 0.2;
  uint64_t prepare_seed = 1234;  // same default as data.synthetic.seed
  int64_t val_tokens = 100000;
  bool markdown = false;
  TokenizerTrainArgs tok_train;
  TokenizerEncodeArgs tok_encode;
};

Config load(const Options& o) {
  std::vector<std::string> sets = o.sets;
  if (!o.out.empty()) sets.push_back("train.out_dir=" + o.out);
  return load_config(o.config, sets);
}

int cmd_train(const Options& o) { return run_training(load(o), o.resume); }

int cmd_eval(const Options& o) {
  Config cfg = load(o);
  verify_checkpoint_dir(o.checkpoint);
  GPT model(gpt_config(cfg), DType::kF32, Device::cpu(), cfg.train.seed);
  load_model_weights(o.checkpoint, model);
  ResolvedData data = resolve_data(cfg);
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
  verify_checkpoint_dir(o.checkpoint);
  TrainerState st = read_trainer_state(o.checkpoint);
  Config cfg = config_from_json_text(st.config_json, {}, o.checkpoint + "/trainer_state.json");
  GPT model(gpt_config(cfg), DType::kF32, Device::cpu(), cfg.train.seed);
  load_model_weights(o.checkpoint, model);
  std::optional<Tokenizer> tokenizer = read_checkpoint_tokenizer(o.checkpoint);
  std::string text = sample_text(model, o.prompt, o.tokens, o.temperature, o.top_k, o.seed,
                                 tokenizer ? &*tokenizer : nullptr);
  std::cout << o.prompt << text << std::endl;
  return kExitOk;
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
    t.val_fraction = o.val_fraction;
    prepare_tokenized_text(t, o.out);
  } else if (!o.tokenizer.empty() || !o.doc_separator.empty()) {
    throw UserError("gtron prepare: --tokenizer and --doc-separator go with --text FILE...");
  } else if (o.text.size() > 1) {
    throw UserError(
        "gtron prepare: the byte-level tokenizer takes one --text file. Hint: pass --tokenizer "
        "tokenizer.json to prepare several files");
  } else if (!o.text.empty()) {
    prepare_text(o.text[0], o.out, o.val_fraction);
  } else if (o.synthetic == "markov") {
    prepare_synthetic_markov(static_cast<int>(o.order), static_cast<int>(o.vocab), o.alpha,
                             o.prepare_tokens, o.val_tokens, o.prepare_seed, o.out);
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
  Options o;
  CLI::App app{"gtron: a small C++/CUDA trainer for GPT models with GTP and MTP"};
  app.require_subcommand(1);
  app.option_defaults()->always_capture_default();

  auto* train = app.add_subcommand("train", "Train a model from a JSON config");
  train->add_option("--config", o.config, "JSON config file")->required();
  train->add_option("--set", o.sets, "Override a config key: key.path=value (repeatable)");
  train->add_option("--out", o.out, "Run directory (overrides train.out_dir)");
  train->add_flag("--resume", o.resume, "Continue from the newest complete checkpoint");

  auto* eval =
      app.add_subcommand("eval", "Validation loss (and per-depth MTP losses) of a checkpoint");
  eval->add_option("--config", o.config, "JSON config file")->required();
  eval->add_option("--checkpoint", o.checkpoint, "Checkpoint directory (…/step_00000100)")
      ->required();
  eval->add_option("--set", o.sets, "Override a config key: key.path=value (repeatable)");

  auto* sample = app.add_subcommand("sample", "Generate text from a checkpoint");
  sample->add_option("--checkpoint", o.checkpoint, "Checkpoint directory")->required();
  sample->add_option("--prompt", o.prompt, "Prompt text");
  sample->add_option("--tokens", o.tokens, "Tokens to generate (bytes for byte-level models)")
      ->check(CLI::Range(1, 1 << 20));
  sample->add_option("--temperature", o.temperature, "Softmax temperature (0 = greedy)")
      ->check(CLI::Range(0.0, 100.0));
  sample->add_option("--top-k", o.top_k, "Sample among the k most likely tokens (0 = all)")
      ->check(CLI::NonNegativeNumber);
  sample->add_option("--seed", o.seed, "Sampling seed");

  auto* prepare = app.add_subcommand(
      "prepare", "Write token shards: text (bytes or BPE) or a synthetic source");
  prepare->add_option("--text", o.text, "Text files (byte-level: one file)");
  prepare->add_option("--tokenizer", o.tokenizer, "tokenizer.json to encode the text with");
  prepare->add_option("--doc-separator", o.doc_separator,
                      "With --tokenizer: a line that separates documents (e.g. %)");
  prepare->add_option("--val-fraction", o.val_fraction, "Fraction of the text for validation");
  prepare->add_option("--synthetic", o.synthetic, "Synthetic source: markov");
  prepare->add_option("--order", o.order, "Markov order K")->check(CLI::PositiveNumber);
  prepare->add_option("--vocab", o.vocab, "Markov vocabulary V")->check(CLI::Range(2, 1 << 20));
  prepare->add_option("--alpha", o.alpha, "Dirichlet concentration of transition rows");
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
  tok_train->add_option("--text", tt.text, "Text files (one document each)")->required();
  tok_train->add_option("--vocab-size", tt.vocab_size, "Tokens: 256 bytes + merges + specials")
      ->required();
  tok_train->add_option("--out", tt.out, "tokenizer.json to write")->required();
  tok_train->add_option("--special", tt.specials, "A special token, kept whole (repeatable)");
  tok_train->add_option("--doc-separator", tt.doc_separator,
                        "A line that separates documents inside a file (e.g. %)");
  tok_train->add_option("--val-fraction", tt.val_fraction,
                        "Leave out the validation split `prepare --val-fraction` makes");
  auto* tok_encode = tokenizer->add_subcommand("encode", "Encode text files; print the speed");
  tok_encode->add_option("--tokenizer", o.tok_encode.tokenizer, "tokenizer.json")->required();
  tok_encode->add_option("--text", o.tok_encode.text, "Text files")->required();
  tok_encode->add_option("--ids-out", o.tok_encode.ids_out, "Write the ids here (one line a file)");

  auto* print = app.add_subcommand("print-config", "Print the resolved config with every default");
  print->add_option("--config", o.config, "JSON config file (none = all defaults)");
  print->add_option("--set", o.sets, "Override a config key: key.path=value (repeatable)");
  print->add_flag("--markdown", o.markdown, "Print the table of every key (README format)");

  // CLI11 reports a mistyped subcommand only as "a subcommand is required": name it instead.
  const std::string first = argc > 1 ? argv[1] : "";
  const bool known = first == "train" || first == "eval" || first == "sample" ||
                     first == "prepare" || first == "tokenizer" || first == "print-config";
  if (!first.empty() && first[0] != '-' && !known) {
    std::fprintf(stderr,
                 "gtron: error: unknown subcommand '%s'; expected one of train, eval, sample, "
                 "prepare, tokenizer, print-config (see gtron --help)\n",
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
    if (*sample) return cmd_sample(o);
    if (*prepare) return cmd_prepare(o);
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
