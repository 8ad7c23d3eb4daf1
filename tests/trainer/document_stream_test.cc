// The streaming pieces under `gtron prepare` and `gtron tokenizer train`: --text expansion, the
// reader's documents (as read_documents cuts text files), the document stream's order for any
// batch size and thread count, the worker pool's error rule, decompression, the shard writer's
// files, and the progress line's policy.
#include "trainer/data/document_stream.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "model/check.h"
#include "tests/trainer/cli_util.h"
#include "tests/trainer/compress_util.h"
#include "trainer/data/byte_source.h"
#include "trainer/data/progress.h"
#include "trainer/data/shard_writer.h"
#include "trainer/data/shards.h"
#include "trainer/data/text_corpus.h"
#include "trainer/data/text_source.h"
#include "trainer/data/worker_pool.h"

namespace gtron {
namespace {

namespace fs = std::filesystem;

std::string read_through(const std::string& path, size_t chunk) {
  ByteSource source(path, compression_of(path));
  std::string out, buf(chunk, '\0');
  for (size_t n; (n = source.read(buf.data(), buf.size())) > 0;) out.append(buf.data(), n);
  return out;
}

// Every document of the stream, with its index, file and line checked along the way.
std::vector<Document> stream_all(const std::vector<TextInput>& inputs, DocumentStreamOptions o,
                                 int threads) {
  WorkerPool pool(threads);
  std::vector<Document> all;
  stream_documents(inputs, o, pool, [&](std::vector<Document>& docs) {
    for (Document& d : docs) {
      EXPECT_EQ(d.index, static_cast<int64_t>(all.size()));
      all.push_back(std::move(d));
    }
  });
  return all;
}

TEST(TextSource, ExpandsDirectoriesAndGlobsInByteOrder) {
  const std::string dir = testing::temp_dir("text_source_expand");
  fs::create_directories(dir + "/d/sub");
  for (const char* f : {"/d/b.jsonl.zst", "/d/B.txt", "/d/a.txt.gz", "/d/sub/c.jsonl", "/d/skip.md",
                        "/d/skip.json", "/x1.txt", "/x2.jsonl.gz"}) {
    testing::write_text(dir + f, "");
  }
  const std::vector<TextInput> in = expand_text_inputs({dir + "/x*", dir + "/d"});
  std::vector<std::string> names;
  for (const TextInput& t : in) names.push_back(t.path.substr(dir.size()));
  EXPECT_EQ(names, (std::vector<std::string>{"/x1.txt", "/x2.jsonl.gz", "/d/B.txt", "/d/a.txt.gz",
                                             "/d/b.jsonl.zst", "/d/sub/c.jsonl"}));
  EXPECT_EQ(in[1].format, TextFormat::kJsonLines);
  EXPECT_EQ(in[1].compression, Compression::kGzip);
  EXPECT_EQ(in[3].format, TextFormat::kText);
  EXPECT_EQ(in[4].compression, Compression::kZstd);
  // A file named directly is text whatever its name.
  EXPECT_EQ(expand_text_inputs({dir + "/d/skip.md"})[0].format, TextFormat::kText);
  EXPECT_THROW(expand_text_inputs({dir + "/none*.txt"}), UserError);
  EXPECT_THROW(expand_text_inputs({dir + "/missing.txt"}), UserError);
  EXPECT_THROW(expand_text_inputs({}), UserError);
}

// The reader cuts text files exactly as read_documents always has: separator lines (with or
// without \r) dropped, the file's last line without a newline, blank documents dropped.
TEST(TextSource, TextFilesBecomeTheDocumentsOfReadDocuments) {
  const std::string dir = testing::temp_dir("text_source_docs");
  testing::write_text(dir + "/a.txt", "one\n%\r\ntwo\nlines\n%\n \n%\n%x\nlast");
  testing::write_text(dir + "/b.txt", "%\nsecond file");
  const std::vector<std::string> want = {"one\n", "two\nlines\n", "%x\nlast", "second file"};
  EXPECT_EQ(read_documents({dir + "/a.txt", dir + "/b.txt"}, "%"), want);
  for (int threads : {1, 3}) {
    DocumentStreamOptions o;
    o.doc_separator = "%";
    o.batch_bytes = 1;
    const std::vector<Document> docs =
        stream_all(expand_text_inputs({dir + "/a.txt", dir + "/b.txt"}), o, threads);
    ASSERT_EQ(docs.size(), 4u);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(docs[i].text, want[i]);
    EXPECT_EQ(docs[1].line, 3);  // "two" follows the separator on line 2
    EXPECT_EQ(docs[3].input, 1);
  }
}

// Any batch size and thread count: the same documents, in input order, numbered from 0, each
// naming its file and line; max_docs stops reading before a bad line further on.
TEST(DocumentStream, KeepsInputOrderForAnyBatchAndThreadCount) {
  const std::string dir = testing::temp_dir("document_stream_order");
  std::string lines;
  std::vector<std::pair<std::string, int>> want;  // (text, line) of one file's documents
  for (int i = 0; i < 500; ++i) {
    lines += i % 50 == 7 ? "\n" : "{\"text\": \"doc " + std::to_string(i) + "\"}\n";
    if (i % 50 != 7) want.emplace_back("doc " + std::to_string(i), i + 1);
  }
  testing::write_text(dir + "/a.jsonl", lines);
  testing::write_zstd(dir + "/b.jsonl.zst", lines, 2);
  const std::vector<TextInput> inputs =
      expand_text_inputs({dir + "/a.jsonl", dir + "/b.jsonl.zst"});
  for (size_t batch : {size_t{1}, size_t{100}, size_t{1} << 20}) {
    for (int threads : {1, 2, 5}) {
      DocumentStreamOptions o;
      o.batch_bytes = batch;
      const std::vector<Document> docs = stream_all(inputs, o, threads);
      ASSERT_EQ(docs.size(), 980u);  // 10 blank lines a file
      for (size_t k = 0; k < docs.size(); ++k) {
        EXPECT_EQ(docs[k].text, want[k % 490].first);
        EXPECT_EQ(docs[k].line, want[k % 490].second);
        EXPECT_EQ(docs[k].input, k < 490 ? 0 : 1);
      }
    }
  }
  testing::write_text(dir + "/bad.jsonl", lines + "{\"text\": 1}\n");
  DocumentStreamOptions o;
  o.batch_bytes = 64;
  o.max_docs = 490;
  EXPECT_EQ(stream_all(expand_text_inputs({dir + "/bad.jsonl"}), o, 2).size(), 490u);
  o.max_docs = 0;
  try {
    stream_all(expand_text_inputs({dir + "/bad.jsonl"}), o, 2);
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl', line 501"), std::string::npos) << e.what();
  }
}

TEST(WorkerPool, CallsEveryIndexOnceAndRethrowsTheSmallestFailure) {
  for (int threads : {1, 4}) {
    WorkerPool pool(threads);
    std::vector<std::atomic<int>> calls(1000);
    pool.parallel_for(calls.size(), [&](size_t i, int worker) {
      EXPECT_LT(worker, pool.size());
      ++calls[i];
    });
    for (const auto& c : calls) EXPECT_EQ(c.load(), 1);
    for (int round = 0; round < 20; ++round) {
      try {
        pool.parallel_for(1000, [](size_t i, int) {
          if (i % 97 == 40) throw std::runtime_error(std::to_string(i));
        });
        ADD_FAILURE() << "no exception";
      } catch (const std::runtime_error& e) {
        EXPECT_STREQ(e.what(), "40");
      }
    }
  }
}

TEST(ByteSource, ReadsEveryGzipMemberAndZstdFrameAndNamesDamage) {
  const std::string dir = testing::temp_dir("byte_source");
  std::string text;
  for (int i = 0; i < 50000; ++i) text += std::to_string(i * 7919 % 10007) + (i % 9 ? " " : "\n");
  testing::write_gzip(dir + "/t.gz", text, 4);
  testing::write_zstd(dir + "/t.zst", text, 4);
  testing::write_text(dir + "/t.txt", text);
  testing::write_text(dir + "/empty.gz", "");
  for (size_t chunk : {size_t{1}, size_t{4096}, size_t{1} << 20}) {
    EXPECT_EQ(read_through(dir + "/t.gz", chunk), text);
    EXPECT_EQ(read_through(dir + "/t.zst", chunk), text);
    EXPECT_EQ(read_through(dir + "/t.txt", chunk), text);
  }
  EXPECT_EQ(read_through(dir + "/empty.gz", 64), "");
  const std::string gz = testing::read_text(dir + "/t.gz");
  testing::write_text(dir + "/cut.gz", gz.substr(0, gz.size() - 3));
  EXPECT_THROW(read_through(dir + "/cut.gz", 4096), UserError);
  testing::write_text(dir + "/junk.gz", gz + "junk");
  EXPECT_THROW(read_through(dir + "/junk.gz", 4096), UserError);
  const std::string zst = testing::read_text(dir + "/t.zst");
  testing::write_text(dir + "/cut.zst", zst.substr(0, zst.size() - 1));
  EXPECT_THROW(read_through(dir + "/cut.zst", 4096), UserError);
  EXPECT_THROW(ByteSource(dir + "/missing.zst", Compression::kZstd), UserError);
}

TEST(ShardWriter, FillsShardsInTurnAndLeavesNothingWithoutCommit) {
  const std::string dir = testing::temp_dir("shard_writer");
  std::vector<int32_t> tokens(25);
  for (int i = 0; i < 25; ++i) tokens[i] = i * 2000;
  {
    ShardWriter w(dir, "train", kShardVersionU16, 10);
    w.append(tokens.data(), 7);
    w.append(tokens.data() + 7, 18);
    EXPECT_EQ(w.commit(), (std::vector<std::string>{dir + "/train_000.bin", dir + "/train_001.bin",
                                                    dir + "/train_002.bin"}));
  }
  ShardSet set(dir + "/train_*.bin", 65536);
  ASSERT_EQ(set.num_shards(), 3);
  EXPECT_EQ(set.num_tokens(0), 10);
  EXPECT_EQ(set.num_tokens(2), 5);
  EXPECT_EQ(set.tokens(1)[0], 20000u);
  EXPECT_EQ(set.tokens(2)[4], 48000u);
  {
    ShardWriter w(dir, "val", kShardVersionU32);
    w.append(tokens);
    EXPECT_THROW(w.append(std::vector<int32_t>{-1}), UserError);
  }
  {
    ShardWriter w(dir, "big", kShardVersionU16);
    EXPECT_THROW(w.append(std::vector<int32_t>{70000}), UserError);  // not uint16
    EXPECT_THROW(w.commit(), UserError);                             // no token
  }
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"train_000.bin", "train_001.bin", "train_002.bin"}));
}

TEST(Progress, TerminalLinesRewriteInPlaceLogLinesArePeriodic) {
  std::FILE* log = std::tmpfile();
  {
    Progress p("prepare", 4000000, log, /*terminal=*/false, /*interval_s=*/0.0);
    p.update(1000000, 10);
    p.update(2000000, 20);
    p.finish();
  }
  std::FILE* quiet = std::tmpfile();
  {
    Progress p("prepare", 4000000, quiet, /*terminal=*/false);  // every 30 s: nothing yet
    p.update(1000000, 10);
    p.finish();
  }
  auto contents = [](std::FILE* f) {
    std::fflush(f);
    std::rewind(f);
    std::string s;
    for (int c; (c = std::fgetc(f)) != EOF;) s += static_cast<char>(c);
    return s;
  };
  const std::string lines = contents(log);
  EXPECT_EQ(std::count(lines.begin(), lines.end(), '\n'), 3) << lines;
  EXPECT_EQ(lines.find('\r'), std::string::npos);
  EXPECT_NE(lines.find("prepare: 2.0 MB of 4.0 MB (50%), 20 documents"), std::string::npos)
      << lines;
  EXPECT_NE(lines.find("ETA"), std::string::npos) << lines;
  EXPECT_EQ(contents(quiet), "");
  std::fclose(log);
  std::fclose(quiet);
}

}  // namespace
}  // namespace gtron
