#include "trainer/sample.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ostream>
#include <sstream>

#include "graphs/decode_graphs.h"
#include "model/generate.h"

namespace gtron {
namespace {

bool byte_level(const GPT& model) { return model.config().vocab_size >= 256; }

std::vector<int32_t> parse_ids(const std::string& text, int64_t V) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long id = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0') {
      throw UserError("--prompt-ids \"" + text + "\": \"" + item +
                      "\" is not a token id. Hint: comma-separated integers, e.g. 1,2,3");
    }
    if (id < 0 || id >= V) {
      throw UserError(
          str_cat("--prompt-ids: id ", id, " is outside the model's vocabulary [0, ", V, ")"));
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

std::vector<int32_t> prompt_of(const GPT& model, const SampleArgs& a, Tokenizer* tok) {
  if (a.prompt_given && a.prompt_ids_given) {
    throw UserError("gtron sample: give --prompt TEXT or --prompt-ids IDS, not both");
  }
  if (!a.prompt_given && !a.prompt_ids_given) {
    throw UserError(
        "gtron sample: no prompt. Hint: --prompt TEXT (byte-level models) or --prompt-ids 1,2,3");
  }
  if (a.prompt_ids_given) {
    std::vector<int32_t> ids = parse_ids(a.prompt_ids, model.config().vocab_size);
    if (ids.empty()) throw UserError("--prompt-ids is empty: generation needs a prompt token");
    return ids;
  }
  if (tok == nullptr && !byte_level(model)) {
    throw UserError(
        str_cat("--prompt takes text, which needs a tokenizer in the checkpoint or a byte-level "
                "model (vocab_size >= 256); this checkpoint has vocab_size ",
                model.config().vocab_size,
                " and no tokenizer.json. Hint: --prompt-ids 1,2,3 "
                "--print-ids"));
  }
  if (a.prompt.empty()) {
    throw UserError("--prompt is empty: generation needs a prompt token. Hint: --prompt TEXT");
  }
  if (tok != nullptr) {
    // The prompt opens as a document does in `gtron prepare` (Tokenizer::document_start).
    std::vector<int32_t> ids =
        tok->document_start("<|endoftext|>").value_or(std::vector<int32_t>{});
    tok->encode_append(a.prompt, &ids);
    return ids;
  }
  std::vector<int32_t> ids;
  for (unsigned char ch : a.prompt) ids.push_back(ch);  // bytes >= 128 stay positive ids
  return ids;
}

void check_flags(const GPT& model, const SampleArgs& a, int64_t prompt_len, const Tokenizer* tok) {
  const GPTConfig& c = model.config();
  if (tok != nullptr && c.vocab_size < tok->vocab_size()) {
    throw UserError(str_cat("the checkpoint's model.vocab_size ", c.vocab_size,
                            " is below its tokenizer's ", tok->vocab_size(), " tokens"));
  }
  if (prompt_len >= c.context_length) {
    throw UserError(str_cat(
        a.prompt_ids_given ? "--prompt-ids" : "--prompt", ": the prompt is ", prompt_len, " tokens",
        tok != nullptr ? " (after the tokens that open a document)" : "", "; it may be at most ",
        c.context_length - 1, " tokens, so that one new token fits the model's context length ",
        c.context_length, ". Hint: shorten the prompt"));
  }
  if (prompt_len + a.tokens > c.context_length) {
    throw UserError(str_cat("--tokens ", a.tokens, ": the prompt (", prompt_len, " tokens) plus ",
                            a.tokens, " new tokens exceed the model's context length ",
                            c.context_length, ". Hint: --tokens ",
                            std::max<int64_t>(c.context_length - prompt_len, 0), " at most"));
  }
  // CLI11's range checks let NaN through (every comparison with it is false).
  if (!std::isfinite(a.temperature) || a.temperature < 0) {
    throw UserError(str_cat("--temperature ", a.temperature, ": must be a number in [0, 100]"));
  }
  if (!(a.top_p > 0 && a.top_p <= 1)) {
    throw UserError(str_cat("--top-p ", a.top_p, " is outside (0, 1]"));
  }
  if (a.top_p < 1 && a.temperature <= 0) {
    throw UserError(str_cat("--top-p ", a.top_p,
                            " needs --temperature > 0 (temperature 0 is greedy decoding, which "
                            "has no nucleus)"));
  }
  if (a.speculative && c.mtp_depth < 1) {
    throw UserError(
        "--speculative drafts with the model's MTP depths; this checkpoint has mtp.depth 0. "
        "Hint: train with mtp.depth >= 1");
  }
  if (a.recompute && a.dtype != "f32") {
    throw UserError("--recompute is the fp32 reference path. Hint: drop --dtype " + a.dtype);
  }
  if (a.speculative && a.recompute) {
    throw UserError("--speculative and --recompute exclude each other");
  }
  if (!a.print_ids && tok == nullptr && !byte_level(model)) {
    throw UserError(str_cat("this checkpoint has vocab_size ", c.vocab_size,
                            " (not byte-level) and no tokenizer.json: its tokens are not text. "
                            "Hint: --print-ids"));
  }
}

void print_row(const std::vector<int32_t>& prompt, const std::vector<int32_t>& tokens, bool ids,
               const SampleArgs& a, const Tokenizer* tok, std::ostream& out) {
  if (!ids && tok != nullptr) {
    out << a.prompt << tok->decode(tokens.data(), static_cast<int64_t>(tokens.size())) << '\n';
    return;
  }
  if (!ids) {
    for (int32_t t : prompt) out << static_cast<char>(t & 0xff);
    for (int32_t t : tokens) out << static_cast<char>(t & 0xff);
    out << '\n';
    return;
  }
  const char* sep = "";
  for (const auto* list : {&prompt, &tokens}) {
    for (int32_t t : *list) {
      out << sep << t;
      sep = ",";
    }
  }
  out << '\n';
}

}  // namespace

Device sample_device(const std::string& flag) {
  if (flag == "cpu") return Device::cpu();
  if (flag != "cuda") {
    throw UserError("--device \"" + flag + "\": expected cpu or cuda");
  }
  if (cuda_device_count() == 0) {
    throw UserError("--device cuda: no GPU found on this machine. Hint: --device cpu");
  }
  return Device::cuda(0);
}

DType sample_dtype(const SampleArgs& a) {
  if (a.dtype == "f32") return DType::kF32;
  if (a.dtype != "bf16") throw UserError("--dtype \"" + a.dtype + "\": expected f32 or bf16");
  if (a.device != "cuda") {
    throw UserError("--dtype bf16 runs on the GPU only. Hint: --device cuda, or --dtype f32");
  }
  return DType::kBF16;
}

void run_sample(GPT& model, const SampleArgs& a, std::ostream& out, std::ostream& err,
                Tokenizer* tokenizer) {
  const std::vector<int32_t> prompt = prompt_of(model, a, tokenizer);
  check_flags(model, a, static_cast<int64_t>(prompt.size()), tokenizer);
  GenerateOptions o;
  o.max_new_tokens = a.tokens;
  o.sampling.temperature = a.temperature;
  o.sampling.top_k = a.top_k;
  o.sampling.top_p = a.top_p;
  o.seed = a.seed;
  o.speculative = a.speculative;
  o.dtype = sample_dtype(a);
  const std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(a.batch), prompt);
  auto run = [&](GenerateOptions opts) {
    // Each generation captures its own steps into its own pool (Note [decode graphs]).
    graphs::DecodeGraphs step_graphs(model.token_embedding().data.device());
    opts.graphs = a.no_graphs ? nullptr : &step_graphs;
    return a.recompute ? generate_recompute(model, prompts, opts) : generate(model, prompts, opts);
  };
  if (a.warmup) {  // untimed, discarded: the device's one-time start-up costs
    GenerateOptions w = o;
    w.max_new_tokens = std::min<int64_t>(a.tokens, kWarmupTokens);
    run(w);
  }
  const Generation g = run(o);
  for (const auto& row : g.tokens) print_row(prompt, row, a.print_ids, a, tokenizer, out);
  out.flush();
  err << g.stats.json() << std::endl;
}

}  // namespace gtron
