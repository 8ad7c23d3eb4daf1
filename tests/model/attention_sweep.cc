#include "tests/model/attention_sweep.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace gtron::bench {

namespace {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  if (!s.empty() && s.back() == ',') out.push_back("");
  return out;
}

bool to_int(const std::string& s, int64_t* v) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *v = x;
  return true;
}

bool to_double(const std::string& s, double* v) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(s.c_str(), &end);
  if (errno != 0 || *end != '\0') return false;
  *v = x;
  return true;
}

std::string bad(const std::string& flag, const std::string& got, const std::string& expected) {
  return "--" + flag + ": got '" + got + "', expected " + expected + " (--help lists the flags)";
}

// An integer flag at least `lo`.
std::string int_flag(const std::string& flag, const std::string& v, int64_t lo, int64_t* out) {
  if (!to_int(v, out) || *out < lo) {
    return bad(flag, v, "an integer >= " + std::to_string(lo));
  }
  return "";
}

std::string int_list(const std::string& flag, const std::string& v, std::vector<int64_t>* out) {
  out->clear();
  for (const std::string& item : split_commas(v)) {
    int64_t x = 0;
    if (!to_int(item, &x) || x <= 0) {
      return bad(flag, v, "a comma-separated list of positive integers");
    }
    out->push_back(x);
  }
  if (out->empty()) return bad(flag, v, "a comma-separated list of positive integers");
  return "";
}

std::string word_list(const std::string& flag, const std::string& v,
                      const std::vector<std::string>& allowed, std::vector<std::string>* out) {
  std::string names;
  for (const std::string& a : allowed) names += (names.empty() ? "" : ",") + a;
  out->clear();
  for (const std::string& item : split_commas(v)) {
    if (std::find(allowed.begin(), allowed.end(), item) == allowed.end()) {
      return bad(flag, v, "a comma-separated list of " + names);
    }
    out->push_back(item);
  }
  if (out->empty()) return bad(flag, v, "a comma-separated list of " + names);
  return "";
}

std::string set_flag(const std::string& name, const std::string& v, SweepFlags* f) {
  if (name == "hs") return int_list(name, v, &f->head_sizes);
  if (name == "T") return int_list(name, v, &f->lengths);
  if (name == "modes") return word_list(name, v, {"mha", "gqa"}, &f->modes);
  if (name == "variants") {
    return word_list(name, v, {"plain", "rope", "bias", "fa3", "fa3p", "fa3pairs", "fa3dq"},
                     &f->variants);
  }
  if (name == "tokens") return int_flag(name, v, 1, &f->tokens);
  if (name == "width") return int_flag(name, v, 1, &f->width);
  if (name == "group") return int_flag(name, v, 1, &f->group);
  if (name == "warmup") return int_flag(name, v, 0, &f->warmup);
  if (name == "repeats") return int_flag(name, v, 1, &f->repeats);
  if (name == "rotate") return int_flag(name, v, 1, &f->rotate);
  if (name == "seed") return int_flag(name, v, 0, &f->seed);
  if (name == "tol") {
    if (!to_double(v, &f->tol) || !(f->tol > 0)) return bad(name, v, "a number > 0");
    return "";
  }
  return "unknown flag --" + name + " (--help lists the flags)";
}

// The shape rules both bench_attention and bench_attention.py apply to the parsed flags.
std::string check_shapes(const SweepFlags& f) {
  for (int64_t hs : f.head_sizes) {
    if (hs != 64 && hs != 128) {
      return bad("hs", std::to_string(hs), "64 or 128 (the flash kernels' head sizes)");
    }
    if (f.width % hs != 0) {
      return "--width " + std::to_string(f.width) + " is not a multiple of head size " +
             std::to_string(hs) + " (NH = width / HS)";
    }
    const int64_t nh = f.width / hs;
    const bool gqa = std::find(f.modes.begin(), f.modes.end(), "gqa") != f.modes.end();
    if (gqa && nh % f.group != 0) {
      return "--group " + std::to_string(f.group) + " does not divide the " + std::to_string(nh) +
             " query heads of head size " + std::to_string(hs) + " (NKV = NH / group)";
    }
  }
  for (int64_t t : f.lengths) {
    if (f.tokens % t != 0) {
      return "--T " + std::to_string(t) + " does not divide --tokens " + std::to_string(f.tokens) +
             " (B = tokens / T)";
    }
  }
  return "";
}

}  // namespace

std::string parse_sweep_flags(int argc, const char* const* argv, SweepFlags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--list") {
      f->list = true;
      continue;
    }
    if (a == "--help" || a == "-h") {
      f->help = true;
      continue;
    }
    if (a.rfind("--", 0) != 0) return "unexpected argument '" + a + "' (--help lists the flags)";
    if (i + 1 >= argc) return a + " needs a value (--help lists the flags)";
    const std::string err = set_flag(a.substr(2), argv[++i], f);
    if (!err.empty()) return err;
  }
  return check_shapes(*f);
}

std::string sweep_usage() {
  return "usage: bench_attention [flags]\n"
         "Times gtron's causal flash attention (forward, backward) over the cells of\n"
         "Note [attention sweep cells] in tests/model/attention_sweep.h, each checked first\n"
         "against the fp32 reference kernels; one JSON line per cell and variant.\n"
         "  --hs 64,128          head sizes (64 and 128 only)\n"
         "  --modes mha,gqa      mha: NKV = NH; gqa: NKV = NH / group\n"
         "  --T 512,...,8192     sequence lengths (each divides --tokens)\n"
         "  --tokens 16384       B*T of every cell\n"
         "  --width 2048         NH*HS\n"
         "  --group 4            query heads per k/v head in gqa cells\n"
         "  --variants plain,rope,bias   launcher options swept (see bench_attention.cc);\n"
         "                       also fa3: the FlashAttention-3-structured kernels (sm_90a),\n"
         "                       fa3p, fa3pairs: fa3 with its persistent forward schedules\n"
         "                       fa3dq: fa3pairs with dQ from the key kernel (ordered sums)\n"
         "  --warmup 10 --repeats 50     untimed and timed calls (the median is reported)\n"
         "  --rotate 3           input sets the calls rotate among\n"
         "  --tol 0.01           normwise relative error bound of the check\n"
         "  --seed 1             of the random inputs\n"
         "  --list               print the cells and exit (no GPU needed)\n";
}

std::vector<AttentionCell> sweep_cells(const SweepFlags& f) {
  std::vector<AttentionCell> cells;
  for (int64_t hs : f.head_sizes) {
    for (const std::string& mode : f.modes) {
      for (int64_t t : f.lengths) {
        AttentionCell c;
        c.HS = hs;
        c.T = t;
        c.B = f.tokens / t;
        c.NH = f.width / hs;
        c.NKV = mode == "gqa" ? c.NH / f.group : c.NH;
        cells.push_back(c);
      }
    }
  }
  return cells;
}

std::string cell_json(const AttentionCell& c) {
  char buf[160];
  std::snprintf(
      buf, sizeof(buf), "{\"hs\": %lld, \"T\": %lld, \"B\": %lld, \"nh\": %lld, \"nkv\": %lld}",
      static_cast<long long>(c.HS), static_cast<long long>(c.T), static_cast<long long>(c.B),
      static_cast<long long>(c.NH), static_cast<long long>(c.NKV));
  return buf;
}

double forward_flops(const AttentionCell& c) {
  return 4.0 * static_cast<double>(c.B) * c.NH * static_cast<double>(c.T) * c.T * c.HS / 2.0;
}

double backward_flops(const AttentionCell& c) { return 2.5 * forward_flops(c); }

const char* flop_convention() {
  return "causal: forward 4*B*nh*T^2*hs/2, backward 2.5x forward (FlashAttention's count; gqa "
         "cells counted per query head)";
}

double tflops(double flops, double ms) { return flops / (ms * 1e-3) / 1e12; }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace gtron::bench
