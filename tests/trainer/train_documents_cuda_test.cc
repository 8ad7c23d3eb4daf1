// data.document_masking on the GPU (Note [document masking] in model/ops/segments.h): training on
// prepared text with the mask through the whole CUDA step (segment ids and GPT-2's positions made
// on the device each micro-batch, the flash kernels at head size 64): graphs.scope layers and full
// (whose captured kernels read the segments at fixed addresses) and train.recompute = "full" give
// the eager losses bit for bit, bf16, both families; fp32 on the GPU (the reference kernels)
// follows the CPU's masked losses; the mask changes the loss (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "model/device.h"
#include "tests/trainer/gpu_train_util.h"
#include "trainer/prepare.h"
#include "trainer/text/bpe_train.h"
#include "trainer/text/tokenizer.h"

namespace gtron {
namespace {

// Short documents (10 to 30 tokens) under a BPE tokenizer with <|endoftext|>, prepared once: every
// window of 32 tokens spans several.
const std::string& prepared_text() {
  static const std::string dir = [] {
    const std::string d = testing::fresh_dir("documents_data");
    const char* words[] = {"red", "green", "blue", "stone", "river", "cloud", "tree", "salt"};
    std::string text;
    for (int i = 0; i < 400; ++i) {
      text += "The";
      for (int w = 0; w < 3 + i % 9; ++w) text += std::string(" ") + words[(i * 5 + w * 3) % 8];
      text += " came " + std::to_string(i % 13) + " times.\n%\n";
    }
    {
      FILE* f = std::fopen((d + "/corpus.txt").c_str(), "w");
      std::fwrite(text.data(), 1, text.size(), f);
      std::fclose(f);
    }
    BpeTrainOptions o;
    o.vocab_size = 300;
    o.specials = {"<|endoftext|>"};
    Tokenizer(train_bpe({std::string_view(text)}, o), "t").save(d + "/tok.json");
    TokenizedTextOptions t;
    t.files = {d + "/corpus.txt"};
    t.tokenizer = d + "/tok.json";
    t.doc_separator = "%";
    t.val_fraction = 0.1;
    prepare_tokenized_text(t, d + "/data");
    return d + "/data";
  }();
  return dir;
}

TrainSummary train_masked(const std::string& name, const std::string& device,
                          const std::string& precision, const std::string& arch,
                          const std::vector<std::string>& sets) {
  std::vector<std::string> all = {"model.arch=" + arch,
                                  "model.vocab_size=320",
                                  "model.n_embd=128",
                                  "model.n_head=2",
                                  "data.train=" + prepared_text() + "/train_*.bin",
                                  "data.val=" + prepared_text() + "/val_*.bin"};
  all.insert(all.end(), sets.begin(), sets.end());
  return testing::train_ok(
      testing::tiny_train_config(testing::fresh_dir(name), device, precision, 12, 4, all));
}

TEST(TrainDocumentsCuda, GraphsAndRecomputeKeepTheMaskedLossesBitForBit) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  for (const std::string arch : {"gpt2", "llama"}) {
    const TrainSummary eager =
        train_masked("docs_eager_" + arch, "cuda", "bf16", arch, {"data.document_masking=true"});
    ASSERT_EQ(eager.losses.size(), 12u);
    const TrainSummary open = train_masked("docs_open_" + arch, "cuda", "bf16", arch, {});
    EXPECT_NE(open.losses[0], eager.losses[0]) << arch << ": the mask changes the first loss";
    const std::vector<std::vector<std::string>> variants = {
        {"graphs.scope=layers"},
        {"graphs.scope=full"},
        {"train.recompute=full", "graphs.scope=layers"},
        {"train.recompute=full", "graphs.scope=full"}};
    for (size_t v = 0; v < variants.size(); ++v) {
      std::vector<std::string> sets = variants[v];
      sets.push_back("data.document_masking=true");
      const TrainSummary g =
          train_masked("docs_" + arch + "_" + std::to_string(v), "cuda", "bf16", arch, sets);
      EXPECT_EQ(g.losses, eager.losses) << arch << " variant " << v;  // bit for bit
      EXPECT_EQ(g.val_loss, eager.val_loss) << arch << " variant " << v;
    }
  }
}

TEST(TrainDocumentsCuda, Fp32FollowsTheCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  for (const std::string arch : {"gpt2", "llama"}) {
    const TrainSummary gpu =
        train_masked("docs_fp32_gpu_" + arch, "cuda", "fp32", arch, {"data.document_masking=true"});
    const TrainSummary cpu =
        train_masked("docs_fp32_cpu_" + arch, "cpu", "fp32", arch, {"data.document_masking=true"});
    ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
    for (size_t i = 0; i < cpu.losses.size(); ++i) {
      EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 1e-3 * std::abs(cpu.losses[i]))
          << arch << " step " << i + 1;
    }
  }
}

}  // namespace
}  // namespace gtron
