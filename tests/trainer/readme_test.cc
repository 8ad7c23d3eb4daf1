// Keeps README.md and the user guide under docs/ true (Note [documentation checks]).
//
// Note [documentation checks]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// What a user reads must not drift from the code, so this test checks, from the code itself:
// - links: every relative link in every Markdown file of the project (the `//:markdown`
//   filegroup and the package READMEs, all in the test's data) names a file or folder that exists
//   in the repository, and every `#anchor` names a heading of its target, by GitHub's rule
//   (github_anchor below);
// - config keys: docs/configuration.md holds exactly the table `gtron print-config --markdown`
//   prints (every key, its type, default, range and meaning);
// - CLI: every subcommand `gtron --help` lists (and their subcommands) is named in docs/cli.md,
//   and every flag its `--help` lists is in the table under its heading `### \`gtron SUB\``;
//   every flag such a table names exists; every `gtronrun --help` option is in
//   docs/parallelism.md;
// - README.md stays a page a newcomer reads in minutes: under 20,000 bytes.
// Link targets are checked in the source tree the runfiles point into (their symlinks resolve
// there), so a link may name any file of the repository, not only the test's data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "tests/trainer/cli_util.h"
#include "trainer/config.h"

namespace gtron {
namespace {

namespace fs = std::filesystem;
using testing::CmdResult;
using testing::run_command;
using testing::run_gtron;

std::string read_file(const fs::path& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path << " not found";
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The repository the runfiles point into (the test runs from the workspace runfiles root).
fs::path source_root() { return fs::canonical("README.md").parent_path(); }

// The project's Markdown files, relative to the repository root: the test's data.
std::vector<std::string> markdown_files() {
  std::vector<std::string> files;
  for (auto it = fs::recursive_directory_iterator("."); it != fs::recursive_directory_iterator();
       ++it) {
    const std::string rel = it->path().lexically_relative(".").string();
    if (rel == "external" || rel.rfind("_", 0) == 0) {  // other repositories, solib folders
      it.disable_recursion_pending();
      continue;
    }
    if (it->path().extension() == ".md") files.push_back(rel);
  }
  std::sort(files.begin(), files.end());
  return files;
}

// The text with fenced code blocks blanked (their lines kept empty, so headings and links inside
// them do not count).
std::string without_fences(const std::string& text) {
  std::istringstream in(text);
  std::string out, line;
  bool fenced = false;
  while (std::getline(in, line)) {
    const size_t first = line.find_first_not_of(' ');
    const bool fence = first != std::string::npos &&
                       (line.compare(first, 3, "```") == 0 || line.compare(first, 3, "~~~") == 0);
    if (fence) fenced = !fenced;
    out += (fence || fenced) ? "\n" : line + "\n";
  }
  return out;
}

// The text with inline code spans removed: a run of n backticks up to the next run of exactly n.
std::string without_code_spans(const std::string& text) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] != '`') {
      out += text[i++];
      continue;
    }
    size_t n = 0;
    while (i + n < text.size() && text[i + n] == '`') ++n;
    const std::string run(n, '`');
    size_t end = text.find(run, i + n);
    while (end != std::string::npos && end + n < text.size() && text[end + n] == '`') {
      end = text.find(run, end + n + 1);
    }
    if (end == std::string::npos) {  // an unmatched run is literal text
      out += run;
      i += n;
    } else {
      i = end + n;
    }
  }
  return out;
}

// GitHub's heading anchor: lowercase; letters, digits, '-' and '_' kept, spaces become '-',
// everything else (punctuation, backticks, symbols such as × or —) dropped. Of the characters
// beyond ASCII only Latin-1 and Latin Extended letters (U+00C0..U+024F but × and ÷) and Greek
// are kept (and not lowercased), which covers every heading this project writes.
std::string github_anchor(const std::string& heading) {
  std::string text = std::regex_replace(heading, std::regex(R"(\[([^\]]*)\]\([^)]*\))"), "$1");
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if (std::isalnum(c) || c == '-' || c == '_') out += static_cast<char>(std::tolower(c));
      if (c == ' ') out += '-';
      ++i;
      continue;
    }
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    uint32_t cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
    for (size_t k = 1; k < len && i + k < text.size(); ++k) cp = (cp << 6) | (text[i + k] & 0x3F);
    const bool letter =
        (cp >= 0xC0 && cp <= 0x24F && cp != 0xD7 && cp != 0xF7) || (cp >= 0x391 && cp <= 0x3C9);
    if (letter) out += text.substr(i, len);
    i += len;
  }
  return out;
}

// Every anchor the headings of a Markdown text give (a repeated one gets -1, -2, ... as on
// GitHub).
std::set<std::string> anchors_of(const std::string& text) {
  static const std::regex heading(R"(^ {0,3}#{1,6}[ \t]+(.*?)[ \t#]*$)");
  std::set<std::string> anchors;
  std::map<std::string, int> seen;
  std::istringstream in(without_fences(text));
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (!std::regex_match(line, m, heading)) continue;
    const std::string a = github_anchor(m[1]);
    const int n = seen[a]++;
    anchors.insert(n == 0 ? a : a + "-" + std::to_string(n));
  }
  return anchors;
}

// The link targets of a Markdown text: inline links and images `[text](target)` and reference
// definitions `[label]: target`, outside code.
std::vector<std::string> link_targets(const std::string& text) {
  static const std::regex inline_link(R"(\]\(\s*<?([^()\s<>]*)>?(?:\s+"[^"]*")?\s*\))");
  static const std::regex reference(R"((?:^|\n) {0,3}\[[^\]]+\]:[ \t]*<?([^\s<>]+))");
  const std::string prose = without_code_spans(without_fences(text));
  std::vector<std::string> targets;
  for (const std::regex* re : {&inline_link, &reference}) {
    for (std::sregex_iterator it(prose.begin(), prose.end(), *re), end; it != end; ++it) {
      targets.push_back((*it)[1]);
    }
  }
  return targets;
}

// "" when `target`, a link in the Markdown file `file` (relative to `root`), resolves; else why.
std::string check_link(const fs::path& root, const std::string& file, const std::string& target) {
  if (std::regex_search(target, std::regex("^[A-Za-z][A-Za-z0-9+.-]*:"))) return "";  // http:...
  const size_t hash = target.find('#');
  const std::string path = target.substr(0, hash);
  const std::string anchor = hash == std::string::npos ? "" : target.substr(hash + 1);
  const fs::path dest =
      path.empty() ? root / file : (root / fs::path(file).parent_path() / path).lexically_normal();
  const std::string rel = dest.lexically_relative(root).string();
  if (rel.empty() || rel.rfind("..", 0) == 0) return "leaves the repository";
  if (!fs::exists(dest)) return rel + " does not exist";
  if (anchor.empty()) return "";
  if (dest.extension() != ".md") return "an anchor into " + rel + ", which is not Markdown";
  const std::set<std::string> anchors = anchors_of(read_file(dest));
  if (anchors.count(anchor)) return "";
  std::string known;
  for (const std::string& a : anchors) known += " " + a;
  return "no heading of " + rel + " gives the anchor '" + anchor + "'; its anchors:" + known;
}

TEST(Docs, GithubAnchorRules) {
  EXPECT_EQ(github_anchor("Several processes: `gtronrun`, DDP, GTP and TP"),
            "several-processes-gtronrun-ddp-gtp-and-tp");
  EXPECT_EQ(github_anchor("The llama family (`model.arch = \"llama\"`)"),
            "the-llama-family-modelarch--llama");
  EXPECT_EQ(github_anchor("gtron vs PyTorch on one H100 (2026-12-05)"),
            "gtron-vs-pytorch-on-one-h100-2026-12-05");
  EXPECT_EQ(github_anchor("DP × GTP, the [guide](docs/x.md) — café"), "dp--gtp-the-guide--café");
  EXPECT_EQ(anchors_of("# A\n```sh\n# not a heading\n```\n## A\n"),
            (std::set<std::string>{"a", "a-1"}));
  EXPECT_EQ(link_targets("[a](x.md#y) `[b](code.md)` ![i](img.png \"t\")\n[r]: ref.md\n"),
            (std::vector<std::string>{"x.md#y", "img.png", "ref.md"}));
}

TEST(Docs, EveryLinkResolves) {
  const fs::path root = source_root();
  const std::vector<std::string> files = markdown_files();
  for (const char* must : {"README.md", "ARCHITECTURE.md", "docs/cli.md", "docs/configuration.md",
                           "trainer/README.md"}) {
    EXPECT_NE(std::find(files.begin(), files.end(), must), files.end())
        << must << " is not in the test's data";
  }
  for (const std::string& file : files) {
    for (const std::string& target : link_targets(read_file(root / file))) {
      const std::string why = check_link(root, file, target);
      EXPECT_EQ(why, "") << file << ": the link (" << target << ") does not resolve: " << why;
    }
  }
}

TEST(Docs, ConfigurationHoldsTheGeneratedKeyTable) {
  const std::string text = read_file("docs/configuration.md");
  EXPECT_NE(text.find(config_markdown_table()), std::string::npos)
      << "docs/configuration.md's key table is stale: paste `gtron print-config --markdown` "
         "into it";
  for (const std::string& key : config_key_paths()) {
    EXPECT_NE(text.find("`" + key + "`"), std::string::npos) << key;
  }
}

// The lines of a `--help` section ("Options:", "Subcommands:") up to the next blank line.
std::vector<std::string> help_section(const std::string& help, const std::string& title) {
  std::vector<std::string> lines;
  std::istringstream in(help);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line == title) {
      inside = true;
    } else if (inside && line.empty()) {
      break;
    } else if (inside) {
      lines.push_back(line);
    }
  }
  return lines;
}

// The long flags a `--help` text defines (CLI11's "  --flag TYPE" and "  -h,--help"; argparse's
// "  -h, --help"), --help itself left out.
std::vector<std::string> defined_flags(const std::vector<std::string>& lines) {
  static const std::regex def(R"(^  (?:-\w, ?)?(--[A-Za-z0-9][A-Za-z0-9-]*)\b.*)");
  std::vector<std::string> flags;
  std::smatch m;
  for (const std::string& line : lines) {
    if (std::regex_match(line, m, def) && m[1] != "--help") flags.push_back(m[1]);
  }
  return flags;
}

// Every subcommand path ("train", "tokenizer train") with the flags its --help lists.
std::map<std::string, std::vector<std::string>> cli_subcommands(const std::string& prefix) {
  std::vector<std::string> args;
  std::istringstream words(prefix);
  for (std::string w; words >> w;) args.push_back(w);
  args.push_back("--help");
  const CmdResult help = run_gtron(args);
  EXPECT_EQ(help.exit_code, 0) << "gtron " << prefix << " --help:\n" << help.output;
  std::map<std::string, std::vector<std::string>> out;
  if (!prefix.empty()) out[prefix] = defined_flags(help_section(help.output, "Options:"));
  static const std::regex sub(R"(^  ([a-z][a-z-]*)\s.*)");
  std::smatch m;
  for (const std::string& line : help_section(help.output, "Subcommands:")) {
    if (!std::regex_match(line, m, sub)) continue;
    const std::string path = prefix.empty() ? std::string(m[1]) : prefix + " " + std::string(m[1]);
    for (auto& [p, flags] : cli_subcommands(path)) out[p] = flags;
  }
  return out;
}

// The text under the heading `### \`gtron PATH\`` of docs/cli.md, up to the next heading.
std::string cli_section(const std::string& cli, const std::string& path) {
  const std::string heading = "\n### `gtron " + path + "`\n";
  const size_t start = cli.find(heading);
  if (start == std::string::npos) return "";
  const size_t end = cli.find("\n#", start + heading.size());
  return cli.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

TEST(Docs, CliGuideHasEverySubcommandAndFlag) {
  const std::string cli = read_file("docs/cli.md");
  const auto subcommands = cli_subcommands("");
  EXPECT_GE(subcommands.size(), 10u) << "gtron --help listed too few subcommands to be parsed";
  for (const auto& [path, flags] : subcommands) {
    EXPECT_NE(cli.find("gtron " + path), std::string::npos)
        << "docs/cli.md never names gtron " << path;
    if (flags.empty()) continue;
    const std::string section = cli_section(cli, path);
    EXPECT_NE(section, "") << "docs/cli.md has no heading ### `gtron " << path << "`";
    for (const std::string& flag : flags) {
      EXPECT_TRUE(section.find("`" + flag + "`") != std::string::npos ||
                  section.find("`" + flag + " ") != std::string::npos)
          << "docs/cli.md, ### `gtron " << path << "`: the flag " << flag << " is not documented";
    }
    static const std::regex row(R"(\n\| `(--[A-Za-z0-9-]+))");
    for (std::sregex_iterator it(section.begin(), section.end(), row), end; it != end; ++it) {
      EXPECT_NE(std::find(flags.begin(), flags.end(), (*it)[1]), flags.end())
          << "docs/cli.md, ### `gtron " << path << "` documents " << (*it)[1] << ", which gtron "
          << path << " --help does not list";
    }
  }
}

TEST(Docs, ParallelismGuideHasEveryLauncherOption) {
  const CmdResult help = run_command("scripts/gtronrun --help");
  ASSERT_EQ(help.exit_code, 0) << help.output;
  const std::vector<std::string> flags = defined_flags([&] {
    std::vector<std::string> lines;
    std::istringstream in(help.output);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }());
  EXPECT_GE(flags.size(), 9u) << help.output;
  const std::string guide = read_file("docs/parallelism.md");
  for (const std::string& flag : flags) {
    EXPECT_NE(guide.find("`" + flag), std::string::npos)
        << "docs/parallelism.md does not document gtronrun " << flag;
  }
}

TEST(Docs, ReadmeStaysShort) {
  EXPECT_LT(fs::file_size("README.md"), 20000u)
      << "README.md is a page: move reference material into the guide under docs/";
}

}  // namespace
}  // namespace gtron
