// The checks of data.document_masking against the rest of the config (step 5 of config.cc's
// order). Whether the data marks its documents is known only from its meta.json: resolve_data
// (trainer/train.h) checks that before any work.
#include "trainer/config.h"
#include "trainer/config_schema.h"

namespace gtron::config_internal {

void check_document_masking(const Config& c) {
  if (!c.data.document_masking) return;
  if (c.data.train.empty()) {
    fail(
        "data.document_masking = true with data.train = \"\": the synthetic Markov source is "
        "one stream of tokens with no documents to mask between",
        "prepare text with a BPE tokenizer (gtron prepare --text FILES --tokenizer "
        "tokenizer.json) and point data.train at its shards, or set data.document_masking = "
        "false");
  }
  if (c.model.arch == ModelArch::kGpt2 && c.parallel.tp > 1 && c.parallel.sequence_parallel) {
    fail(
        "data.document_masking = true with model.arch = \"gpt2\" and parallel.sequence_parallel "
        "= true: GPT-2's positions restart at each document, which is not built for a rank's "
        "chunk of the sequence",
        "set parallel.sequence_parallel = false, or use model.arch = \"llama\"");
  }
}

}  // namespace gtron::config_internal
