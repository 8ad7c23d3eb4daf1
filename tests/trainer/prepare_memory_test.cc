// `gtron prepare` streams its input: a child process prepares, on two threads, a .jsonl.zst whose
// content is larger than the memory cap the test sets, and its peak resident memory stays under
// the cap. Holding the input, or its tokens, would not fit.
//
// The cap is on resident memory (the child's ru_maxrss, from wait4), not on address space
// (RLIMIT_AS): every tokenizer's PCRE2 JIT stack reserves 256 MiB of address space it never
// touches (trainer/text/pretokenize.cc), as does each glibc malloc arena (64 MiB), so an address
// space cap would measure reservations, not use.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "model/check.h"
#include "tests/trainer/cli_util.h"
#include "tests/trainer/compress_util.h"
#include "trainer/prepare.h"
#include "trainer/text/bpe_train.h"
#include "trainer/text/tokenizer.h"

namespace gtron {
namespace {

// The child's peak resident memory, the test process's own included (the child starts as its
// copy): a few read batches, their documents and tokens, two tokenizers with their caches.
constexpr int64_t kCap = int64_t{160} << 20;

// A document of `words` words from a small vocabulary (lcg: the state, advanced).
std::string document(uint64_t* lcg, int words) {
  static const char* kWords[] = {"river", "stone", "cloud", "green", "quiet", "amber",
                                 "north", "light", "ember", "frost", "delta", "sigma"};
  std::string doc;
  for (int w = 0; w < words; ++w) {
    *lcg = *lcg * 6364136223846793005ULL + 1442695040888963407ULL;
    doc += (w ? " " : "") + std::string(kWords[(*lcg >> 33) % 12]);
  }
  return doc + ".\n";
}

TEST(PrepareMemory, StreamsAnInputLargerThanItsMemoryCap) {
  const std::string dir = testing::temp_dir("prepare_memory");
  uint64_t lcg = 7;
  BpeTrainOptions o;
  o.vocab_size = 300;
  o.specials = {"<|endoftext|>"};
  Tokenizer(train_bpe({document(&lcg, 20000)}, o), "t").save(dir + "/tok.json");

  const int64_t want = kCap + (int64_t{64} << 20);  // content bytes: more than the cap
  int64_t content = 0, docs = 0;
  {
    testing::ZstdFileWriter zst(dir + "/big.jsonl.zst");
    while (content < want) {
      const std::string doc = document(&lcg, 2000);
      zst.write(nlohmann::json({{"text", doc}}).dump() + "\n");
      content += static_cast<int64_t>(doc.size());
      ++docs;
    }
  }
  std::fflush(nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    TokenizedTextOptions t;
    t.files = {dir + "/big.jsonl.zst"};
    t.tokenizer = dir + "/tok.json";
    t.threads = 2;
    try {
      prepare_tokenized_text(t, dir + "/out");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      _exit(2);
    }
    _exit(0);
  }
  int status = 0;
  rusage usage{};
  ASSERT_EQ(wait4(pid, &status, 0, &usage), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  ASSERT_EQ(WEXITSTATUS(status), 0) << "see the error above";
  const int64_t peak = int64_t{usage.ru_maxrss} * 1024;
  std::printf("content %.0f MiB in %ld documents; peak resident memory %.0f MiB, cap %.0f MiB\n",
              content / 1048576.0, static_cast<long>(docs), peak / 1048576.0, kCap / 1048576.0);
  EXPECT_LT(peak, kCap);

  std::ifstream in(dir + "/out/meta.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json meta = nlohmann::json::parse(ss.str());
  EXPECT_EQ(meta["text_bytes"].get<int64_t>(), content);
  EXPECT_GT(meta["text_bytes"].get<int64_t>(), kCap);
  EXPECT_EQ(meta["documents"].get<int64_t>() + meta["val_documents"].get<int64_t>(), docs);
}

}  // namespace
}  // namespace gtron
