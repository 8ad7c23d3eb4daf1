#include "trainer/data/text_source.h"

#include <glob.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/check.h"

namespace gtron {
namespace {

namespace fs = std::filesystem;

constexpr size_t kChunkBytes = size_t{1} << 20;  // content bytes decoded per read
constexpr const char* kDirSuffixes[] = {".txt",      ".jsonl",   ".txt.gz",
                                        ".jsonl.gz", ".txt.zst", ".jsonl.zst"};

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool blank(std::string_view s) { return s.find_first_not_of(" \t\r\n\f\v") == std::string::npos; }

std::string where(const std::string& path, int64_t line) {
  return str_cat("text input '", path, "', line ", line);
}

void add_file(const std::string& path, std::vector<TextInput>* out) {
  out->push_back(text_input_for(path));
}

// Every file below `dir` with a suffix of kDirSuffixes, in byte order of their paths.
void add_directory(const std::string& dir, std::vector<TextInput>* out) {
  std::vector<std::string> files;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool text = std::any_of(std::begin(kDirSuffixes), std::end(kDirSuffixes),
                                  [&](const char* s) { return ends_with(name, s); });
    if (text && it->is_regular_file(ec)) files.push_back(it->path().string());
  }
  if (ec) throw UserError(str_cat("--text '", dir, "': cannot list the directory: ", ec.message()));
  if (files.empty()) {
    throw UserError(str_cat("--text '", dir,
                            "': the directory holds no .txt, .jsonl, .jsonl.gz or .jsonl.zst file "
                            "(.txt.gz and .txt.zst count too). Hint: name the files directly."));
  }
  std::sort(files.begin(), files.end());
  for (const std::string& f : files) add_file(f, out);
}

void add_glob(const std::string& pattern, std::vector<TextInput>* out) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), GLOB_NOSORT, nullptr, &g);
  std::vector<std::string> matches(g.gl_pathv, g.gl_pathv + (rc == 0 ? g.gl_pathc : 0));
  globfree(&g);
  if (matches.empty()) {
    throw UserError(str_cat("--text '", pattern,
                            "': the glob matches no file. Hint: quote it so that gtron, not the "
                            "shell, expands it, and check the folder."));
  }
  std::sort(matches.begin(), matches.end());  // byte order, whatever the locale
  std::error_code ec;
  for (const std::string& m : matches) {
    if (fs::is_directory(m, ec)) {
      add_directory(m, out);
    } else if (fs::is_regular_file(m, ec)) {
      add_file(m, out);
    }
  }
}

}  // namespace

TextInput text_input_for(const std::string& path) {
  TextInput input;
  input.path = path;
  input.compression = compression_of(path);
  std::string_view name = path;
  if (input.compression == Compression::kGzip) name.remove_suffix(3);
  if (input.compression == Compression::kZstd) name.remove_suffix(4);
  input.format = ends_with(name, ".jsonl") ? TextFormat::kJsonLines : TextFormat::kText;
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  input.file_bytes = ec ? 0 : static_cast<int64_t>(size);
  return input;
}

std::vector<TextInput> expand_text_inputs(const std::vector<std::string>& args) {
  if (args.empty()) throw UserError("no text files given. Hint: --text FILE...");
  std::vector<TextInput> inputs;
  std::error_code ec;
  for (const std::string& arg : args) {
    if (arg.find_first_of("*?[") != std::string::npos && !fs::exists(arg, ec)) {
      add_glob(arg, &inputs);
    } else if (fs::is_directory(arg, ec)) {
      add_directory(arg, &inputs);
    } else if (fs::is_regular_file(arg, ec)) {
      add_file(arg, &inputs);
    } else {
      throw UserError(str_cat("text file '", arg,
                              "': does not exist or is not a regular file (nor a directory or a "
                              "glob that matches files)."));
    }
  }
  if (inputs.empty()) throw UserError("--text names no regular file. Hint: --text FILE...");
  return inputs;
}

RawDocumentReader::RawDocumentReader(std::vector<TextInput> inputs, std::string doc_separator)
    : inputs_(std::move(inputs)), separator_(std::move(doc_separator)), chunk_(kChunkBytes) {}

RawDocumentReader::~RawDocumentReader() = default;

void RawDocumentReader::next(RawBatch* batch, size_t target_bytes) {
  batch->bytes.clear();
  batch->docs.clear();
  batch->error = nullptr;
  batch->last = false;
  try {
    while (file_ < inputs_.size() && batch->bytes.size() < target_bytes) read_chunk(batch);
  } catch (const UserError& e) {
    const TextInput& input = inputs_[file_];
    // A file that cannot be opened names itself; a read or decoding error needs the place.
    const std::string what = e.what();
    batch->error = std::make_exception_ptr(
        source_ ? UserError(str_cat(where(input.path, line_ + 1), ": ", what,
                                    ". Hint: check the file (e.g. gzip -t or zstd -t)."))
                : e);
    batch->last = true;
    return;
  }
  batch->file_bytes_done = file_bytes_before_ + (source_ ? source_->file_bytes_read() : int64_t{0});
  batch->last = file_ == inputs_.size();
}

// Reads one chunk of the current file (opening it first); at its end, finishes the file.
void RawDocumentReader::read_chunk(RawBatch* batch) {
  const TextInput& input = inputs_[file_];
  if (!source_) {
    source_ = std::make_unique<ByteSource>(input.path, input.compression);
    line_ = 0;
    doc_line_ = 1;
    partial_.clear();
    doc_.clear();
  }
  const size_t n = source_->read(chunk_.data(), chunk_.size());
  if (n == 0) {
    end_file(batch);
    return;
  }
  std::string_view chunk(chunk_.data(), n);
  if (input.format == TextFormat::kText && separator_.empty()) {
    doc_.append(chunk);  // the whole file is one document
    return;
  }
  while (!chunk.empty()) {
    const size_t nl = chunk.find('\n');
    if (nl == std::string_view::npos) {
      partial_.append(chunk);
      return;
    }
    if (partial_.empty()) {
      on_line(chunk.substr(0, nl + 1), batch);
    } else {
      partial_.append(chunk.substr(0, nl + 1));
      on_line(partial_, batch);
      partial_.clear();
    }
    chunk.remove_prefix(nl + 1);
  }
}

// One line, its '\n' included (the file's last line may lack it).
void RawDocumentReader::on_line(std::string_view line, RawBatch* batch) {
  ++line_;
  if (inputs_[file_].format == TextFormat::kJsonLines) {
    if (blank(line)) return;
    batch->docs.push_back({batch->bytes.size(), line.size(), static_cast<int32_t>(file_), line_,
                           /*json=*/true});
    batch->bytes.append(line);
    return;
  }
  std::string_view bare = line;
  if (!bare.empty() && bare.back() == '\n') bare.remove_suffix(1);
  if (!bare.empty() && bare.back() == '\r') bare.remove_suffix(1);
  if (bare == separator_) {
    end_document(batch);
    doc_line_ = line_ + 1;
  } else {
    doc_.append(line);
  }
}

void RawDocumentReader::end_document(RawBatch* batch) {
  if (!blank(doc_)) {
    batch->docs.push_back(
        {batch->bytes.size(), doc_.size(), static_cast<int32_t>(file_), doc_line_, /*json=*/false});
    batch->bytes.append(doc_);
  }
  doc_.clear();
}

void RawDocumentReader::end_file(RawBatch* batch) {
  if (!partial_.empty()) {
    std::string last = std::move(partial_);
    partial_.clear();
    on_line(last, batch);
  }
  if (inputs_[file_].format == TextFormat::kText) end_document(batch);
  file_bytes_before_ += source_->file_bytes_read();
  source_.reset();
  ++file_;
}

std::string parse_json_line(std::string_view line, const std::string& text_field,
                            const std::string& path, int64_t line_number) {
  const auto here = [&] { return where(path, line_number); };  // built only for a message
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(line.begin(), line.end());
  } catch (const nlohmann::json::exception& e) {
    // nlohmann's message ends with everything it read of the value ("last read: '...'"): a
    // whole document, at times. The position says enough.
    std::string why = e.what();
    why.resize(std::min(why.find("; last read"), size_t{300}));
    throw UserError(str_cat(here(), ": not valid JSON (", why,
                            "). Hint: a .jsonl file holds one JSON object per line."));
  }
  if (!value.is_object()) {
    throw UserError(str_cat(here(), ": a JSON ", value.type_name(),
                            ", not an object. Hint: a .jsonl file holds one JSON object per "
                            "line, e.g. {\"",
                            text_field, "\": \"...\"}."));
  }
  const auto it = value.find(text_field);
  if (it == value.end()) {
    std::string keys;
    for (const auto& [key, v] : value.items()) keys += (keys.empty() ? "" : ", ") + key;
    throw UserError(str_cat(here(), ": the object has no member \"", text_field,
                            "\" (its members: ", keys.empty() ? "none" : keys,
                            "). Hint: --text-field names the member that holds the text."));
  }
  if (!it->is_string()) {
    throw UserError(str_cat(here(), ": the member \"", text_field, "\" is a JSON ", it->type_name(),
                            ", not a string."));
  }
  return std::move(it->get_ref<std::string&>());
}

}  // namespace gtron
