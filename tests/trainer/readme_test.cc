// Keeps README.md true: its configuration table is exactly `gtron print-config --markdown`, and it
// names every CLI subcommand.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "trainer/config.h"

namespace gtron {
namespace {

std::string readme() {
  std::ifstream f("README.md");  // the test runs from the workspace runfiles root
  EXPECT_TRUE(f.good()) << "README.md not found in the test's runfiles";
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(Readme, HoldsTheGeneratedConfigTable) {
  const std::string text = readme();
  EXPECT_NE(text.find(config_markdown_table()), std::string::npos)
      << "README.md's config table is stale: paste `gtron print-config --markdown` into it";
  for (const std::string& key : config_key_paths()) {
    EXPECT_NE(text.find("`" + key + "`"), std::string::npos) << key;
  }
}

TEST(Readme, NamesEverySubcommand) {
  const std::string text = readme();
  for (const char* cmd : {"gtron train", "gtron eval", "gtron sample", "gtron logits",
                          "gtron prepare", "gtron tokenizer train", "gtron tokenizer encode",
                          "gtron export", "gtron import", "gtron print-config"}) {
    EXPECT_NE(text.find(cmd), std::string::npos) << cmd;
  }
}

}  // namespace
}  // namespace gtron
