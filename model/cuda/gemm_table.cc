// The GEMM key and the pinned-algorithm table (contract in gemm_table.h).
#include "model/cuda/gemm_table.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>

#include "model/check.h"
#include "model/dtype.h"

namespace gtron::cuda {

namespace {

// The largest power of two (<= 256) dividing the address and, for batches, the byte stride:
// every matrix of the batch is at least that aligned.
int64_t alignment(const void* p, int64_t batch, int64_t stride_bytes) {
  uint64_t v = reinterpret_cast<uintptr_t>(p);
  if (batch > 1) v |= static_cast<uint64_t>(stride_bytes);
  int64_t a = 256;
  while (a > 1 && v % static_cast<uint64_t>(a) != 0) a /= 2;
  return a;
}

void check_entry(const TunedGemm& e) {
  GTRON_CHECK(e.index >= 0 && e.requested > e.index, "pinned GEMM entry for ", e.device,
              " m = ", e.key[kKeyM], ", n = ", e.key[kKeyN], ", k = ", e.key[kKeyK], ": index ",
              e.index, " of ", e.requested, " requested; expected 0 <= index < requested");
}

struct Added {
  std::mutex mu;
  std::vector<TunedGemm> entries;
};

Added& added() {
  static Added a;
  return a;
}

const char* epilogue_name(int64_t e) {
  switch (static_cast<Epilogue>(e)) {
    case Epilogue::kNone:
      return "none";
    case Epilogue::kGeluAux:
      return "gelu_aux";
    case Epilogue::kDGelu:
      return "dgelu";
  }
  return "?";
}

// GTRON_GEMM_TABLE_FILE: its entries are added once, before the first lookup.
void load_table_file_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* path = std::getenv("GTRON_GEMM_TABLE_FILE");
    if (path == nullptr || *path == '\0') return;
    std::ifstream in(path);
    if (!in) throw UserError(str_cat("GTRON_GEMM_TABLE_FILE '", path, "' cannot be read"));
    std::ostringstream text;
    text << in.rdbuf();
    const std::vector<TunedGemm> entries = parse_tuned_gemm_entries(text.str(), path);
    // add_tuned_gemm puts each ahead of the last: add in reverse so the file's first entry for a
    // key wins, as in the committed table.
    for (auto it = entries.rbegin(); it != entries.rend(); ++it) add_tuned_gemm(*it);
  });
}

}  // namespace

std::vector<TunedGemm> parse_tuned_gemm_entries(const std::string& text,
                                                const std::string& source) {
  std::vector<TunedGemm> out;
  std::istringstream lines(text);
  std::string line;
  for (int n = 1; std::getline(lines, line); ++n) {
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line.compare(first, 2, "//") == 0) continue;
    auto bad = [&](const std::string& why) {
      return UserError(str_cat(source, ":", n, ": ", why, "; expected a gemm_tuned.inc line ",
                               "{\"device\", version, {", kGemmKeyFields,
                               " key fields}, index, requested},"));
    };
    const size_t q0 = line.find('"'), q1 = q0 == std::string::npos ? q0 : line.find('"', q0 + 1);
    if (line[first] != '{' || q1 == std::string::npos) throw bad("no quoted device name");
    TunedGemm e;
    e.device = line.substr(q0 + 1, q1 - q0 - 1);
    std::vector<int64_t> nums;
    for (size_t i = q1 + 1; i < line.size();) {
      const char c = line[i];
      if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) {
        size_t used = 0;
        nums.push_back(std::stoll(line.substr(i), &used));
        i += used;
      } else if (c == ',' || c == '{' || c == '}' || c == ' ' || c == '\t' || c == '\r') {
        ++i;
      } else {
        throw bad(str_cat("unexpected '", std::string(1, c), "'"));
      }
    }
    if (nums.size() != static_cast<size_t>(kGemmKeyFields) + 3) {
      throw bad(str_cat(nums.size(), " numbers"));
    }
    e.cublaslt_version = static_cast<size_t>(nums[0]);
    std::copy(nums.begin() + 1, nums.begin() + 1 + kGemmKeyFields, e.key.begin());
    e.index = static_cast<int>(nums[kGemmKeyFields + 1]);
    e.requested = static_cast<int>(nums[kGemmKeyFields + 2]);
    if (e.index < 0 || e.requested <= e.index) {
      throw bad(str_cat("index ", e.index, " of ", e.requested, " requested"));
    }
    out.push_back(e);
  }
  return out;
}

GemmKey gemm_key(const GemmArgs& g) {
  const int64_t ab_size = g.fp8 ? 1 : static_cast<int64_t>(dtype_size(g.ab));
  const int64_t c_size = static_cast<int64_t>(dtype_size(g.c_type));
  GemmKey key{};
  key[kKeyM] = g.m;
  key[kKeyN] = g.n;
  key[kKeyK] = g.k;
  key[kKeyBatch] = g.batch;
  key[kKeyStrideA] = g.stride_a;
  key[kKeyStrideB] = g.stride_b;
  key[kKeyStrideC] = g.stride_c;
  key[kKeyTransA] = g.trans_a;
  key[kKeyTransB] = g.trans_b;
  key[kKeyAbType] = static_cast<int64_t>(g.ab);
  key[kKeyCType] = static_cast<int64_t>(g.c_type);
  key[kKeyAlignB] = alignment(g.b, g.batch, g.stride_b * ab_size);
  key[kKeyAlignA] = alignment(g.a, g.batch, g.stride_a * ab_size);
  key[kKeyAlignC] = alignment(g.c, g.batch, g.stride_c * c_size);
  if (g.d != nullptr)
    key[kKeyAlignC] = std::min(key[kKeyAlignC], alignment(g.d, g.batch, g.stride_c * c_size));
  key[kKeyAlignBias] = g.bias != nullptr ? alignment(g.bias, 1, 0) : 0;
  key[kKeyHasBias] = g.bias != nullptr;
  key[kKeyBiasType] = g.bias != nullptr ? static_cast<int64_t>(g.bias_type) : -1;
  key[kKeyBetaZero] = g.beta == 0.0f;
  key[kKeyEpilogue] = static_cast<int64_t>(g.epilogue);
  key[kKeyAux] = g.aux != nullptr ? alignment(g.aux, 1, 0) + 1000 * g.aux_ld : 0;
  key[kKeyFp8] = !g.fp8 ? 0 : g.b_scales == Fp8Scales::kBlocks ? 2 : 1;
  return key;
}

const std::vector<TunedGemm>& committed_tuned_gemms() {
  static const std::vector<TunedGemm> table = {
#include "model/cuda/gemm_tuned.inc"
  };
  return table;
}

std::optional<PinnedChoice> find_tuned_gemm(const std::string& device, size_t cublaslt_version,
                                            const GemmKey& key) {
  auto matches = [&](const TunedGemm& e) {
    return e.cublaslt_version == cublaslt_version && e.key == key && e.device == device;
  };
  load_table_file_once();
  {
    Added& a = added();
    std::lock_guard<std::mutex> lock(a.mu);
    for (const TunedGemm& e : a.entries) {
      if (matches(e)) return PinnedChoice{e.index, e.requested};
    }
  }
  for (const TunedGemm& e : committed_tuned_gemms()) {
    if (!matches(e)) continue;
    check_entry(e);
    return PinnedChoice{e.index, e.requested};
  }
  return std::nullopt;
}

void add_tuned_gemm(const TunedGemm& entry) {
  check_entry(entry);
  Added& a = added();
  std::lock_guard<std::mutex> lock(a.mu);
  a.entries.insert(a.entries.begin(), entry);  // the latest addition wins
}

void clear_added_tuned_gemms() {
  Added& a = added();
  std::lock_guard<std::mutex> lock(a.mu);
  a.entries.clear();
}

std::string tuned_gemm_entry(const TunedGemm& entry) {
  std::ostringstream os;
  os << "{\"" << entry.device << "\", " << entry.cublaslt_version << ", {";
  for (int i = 0; i < kGemmKeyFields; ++i) os << (i ? ", " : "") << entry.key[i];
  os << "}, " << entry.index << ", " << entry.requested << "},";
  return os.str();
}

std::string gemm_key_json(const GemmKey& key) {
  auto type = [](int64_t t) { return dtype_name(static_cast<DType>(t)); };
  auto flag = [](int64_t v) { return v != 0 ? "true" : "false"; };
  std::ostringstream os;
  os << "\"m\": " << key[kKeyM] << ", \"n\": " << key[kKeyN] << ", \"k\": " << key[kKeyK]
     << ", \"batch\": " << key[kKeyBatch] << ", \"trans_a\": " << flag(key[kKeyTransA])
     << ", \"trans_b\": " << flag(key[kKeyTransB]) << ", \"ab\": \"" << type(key[kKeyAbType])
     << "\", \"c\": \"" << type(key[kKeyCType]) << "\", \"epilogue\": \""
     << epilogue_name(key[kKeyEpilogue]) << "\", \"bias\": " << flag(key[kKeyHasBias])
     << ", \"beta0\": " << flag(key[kKeyBetaZero]) << ", \"fp8\": " << key[kKeyFp8];
  return os.str();
}

}  // namespace gtron::cuda
