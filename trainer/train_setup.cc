// What a run resolves from its config before the loop: the model's GPTConfig, where its data
// comes from (train.h), the device and precision, and the communicators (run.h).
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/cuda/runtime.h"
#include "parallel/gloo_communicator.h"
#include "parallel/ipc_communicator.h"
#include "parallel/nccl_communicator.h"
#include "trainer/prepare.h"
#include "trainer/run.h"
#include "trainer/train.h"

namespace gtron {

namespace {

std::optional<double> meta_number(const std::string& meta_path, const char* key) {
  std::ifstream f(meta_path);
  if (!f) return std::nullopt;
  try {
    nlohmann::json j = nlohmann::json::parse(f);
    if (j.contains(key) && j[key].is_number()) return j[key].get<double>();
  } catch (const nlohmann::json::exception&) {
  }
  return std::nullopt;
}

std::string meta_string(const std::string& meta_path, const char* key) {
  std::ifstream f(meta_path);
  if (!f) return "";
  try {
    nlohmann::json j = nlohmann::json::parse(f);
    if (j.contains(key) && j[key].is_string()) return j[key].get<std::string>();
  } catch (const nlohmann::json::exception&) {
  }
  return "";
}

// meta.json's doc_start_ids[0] (the token that opens every document of prepared text), if any.
std::optional<int32_t> meta_document_start(const std::string& meta_path) {
  std::ifstream f(meta_path);
  if (!f) return std::nullopt;
  try {
    nlohmann::json j = nlohmann::json::parse(f);
    const nlohmann::json& ids = j.contains("doc_start_ids") ? j["doc_start_ids"] : nlohmann::json();
    if (ids.is_array() && !ids.empty() && ids[0].is_number_integer()) return ids[0].get<int32_t>();
  } catch (const nlohmann::json::exception&) {
  }
  return std::nullopt;
}

// data.document_masking: the document start token of the data, or a UserError saying why not
// (the config refused the synthetic source and GPT-2 under sequence parallelism already).
int32_t document_start_for(const Config& cfg, const std::string& meta) {
  const std::optional<int32_t> start = meta_document_start(meta);
  if (!start) {
    const bool synthetic = meta_string(meta, "source") == "markov";
    throw UserError(str_cat(
        "data.document_masking = true needs data whose documents are marked, but ", meta,
        synthetic ? " describes synthetic Markov data, a single stream with no documents"
                  : " is missing or has no doc_start_ids (gtron prepare records the token that "
                    "opens each document only for text encoded with a BPE tokenizer; "
                    "byte-level text has none)",
        ". Hint: gtron prepare --text FILES --tokenizer tokenizer.json, or "
        "data.document_masking=false"));
  }
  if (*start < 0 || *start >= cfg.model.vocab_size) {
    throw UserError(str_cat("data.document_masking: ", meta, " gives document start token ", *start,
                            ", outside model.vocab_size ", cfg.model.vocab_size));
  }
  return *start;
}

std::string dirname_of(const std::string& glob) {
  const size_t slash = glob.rfind('/');
  return slash == std::string::npos ? "." : glob.substr(0, slash);
}

}  // namespace

void make_dirs(const std::string& path) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!cur.empty() && ::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
        throw UserError("cannot create directory '" + cur + "' (" + std::strerror(errno) + ")");
      }
    }
    if (i < path.size()) cur += path[i];
  }
}

ResolvedData resolve_data(const Config& cfg) {
  ResolvedData d;
  if (cfg.data.train.empty()) {
    const SyntheticDataConfig& s = cfg.data.synthetic;
    const std::string dir = cfg.train.out_dir + "/data";
    make_dirs(cfg.train.out_dir);
    prepare_synthetic_markov(static_cast<int>(s.order), static_cast<int>(s.vocab), s.alpha,
                             s.tokens, s.val_tokens, s.seed, dir, s.bigram);
    d.train_glob = dir + "/train_*.bin";
    d.val_glob = cfg.data.val.empty() ? dir + "/val_*.bin" : cfg.data.val;
  } else {
    d.train_glob = cfg.data.train;
    d.val_glob = cfg.data.val.empty() ? cfg.data.train : cfg.data.val;
  }
  const std::string meta = dirname_of(d.train_glob) + "/meta.json";
  d.entropy_rate = meta_number(meta, "entropy_rate");
  d.unigram_entropy = meta_number(meta, "unigram_entropy");
  const std::optional<double> vocab = meta_number(meta, "vocab");
  if (vocab && *vocab > static_cast<double>(cfg.model.vocab_size)) {
    throw UserError(str_cat("model.vocab_size ", cfg.model.vocab_size, " is below the ",
                            static_cast<int64_t>(*vocab), " tokens of the data (", meta,
                            "). Hint: --set model.vocab_size=", static_cast<int64_t>(*vocab)));
  }
  if (meta_string(meta, "tokenizer") == "bpe") {
    d.tokenizer_path = dirname_of(d.train_glob) + "/tokenizer.json";
    d.val_tokens = meta_number(meta, "val_tokens");
    d.val_bytes = meta_number(meta, "val_bytes");
  }
  if (cfg.data.document_masking) d.document_start = document_start_for(cfg, meta);
  return d;
}

namespace internal {

// The device and precision a run uses: "auto" is a GPU when one is present, else the CPU; "cuda"
// without a GPU is a UserError (resolve_device). Several processes on one node: with
// parallel.backend "ipc", process LOCAL_RANK takes GPU LOCAL_RANK mod (GPUs) and they share it;
// otherwise each takes its own GPU, cuda:LOCAL_RANK (NCCL), and more processes than GPUs is an
// error before any work (naming "ipc") unless the run is on the CPU (Gloo): train.device "cpu",
// parallel.backend "gloo", or no GPU at all. Precision "auto" is bf16 on cuda, fp32 on the CPU.
DevicePlan pick_device(const Config& cfg, const parallel::DistEnv& env) {
  const int gpus = cuda_device_count();
  const CommBackend backend = cfg.parallel.backend;
  const bool cpu_forced = cfg.train.device == DeviceChoice::kCpu || backend == CommBackend::kGloo;
  if (backend == CommBackend::kIpc && env.world_size > 1) {
    if (gpus == 0) {
      throw UserError(
          "parallel.backend = \"ipc\": needs a GPU, and this node has none. Hint: "
          "parallel.backend=gloo train.device=cpu for multi-process CPU training");
    }
    if (env.world_size != env.local_world_size) {
      throw UserError(
          str_cat("parallel.backend = \"ipc\": every process must run on one node, "
                  "but the world has ",
                  env.world_size, " processes and this node ", env.local_world_size,
                  ". Hint: parallel.backend=nccl across nodes"));
    }
    if (env.local_world_size > parallel::ipc::kMaxRanks) {
      throw UserError(str_cat("parallel.backend = \"ipc\": ", env.local_world_size,
                              " processes; at most ", parallel::ipc::kMaxRanks,
                              ". Hint: --nproc-per-node ", parallel::ipc::kMaxRanks, " or fewer"));
    }
  } else if (env.world_size > 1 && !cpu_forced && gpus > 0 && gpus < env.local_world_size) {
    throw UserError(str_cat(env.local_world_size, " processes on this node but ", gpus,
                            " GPU(s): NCCL needs a GPU per process. Hint: --set "
                            "parallel.backend=ipc to share the GPUs (CUDA IPC), --nproc-per-node ",
                            gpus, ", or train.device=cpu for Gloo multi-process training"));
  }
  const DeviceChoice d = cpu_forced ? DeviceChoice::kCpu : resolve_device(cfg.train, gpus > 0);
  const PrecisionChoice p = resolve_precision(cfg.train, d);
  if (d == DeviceChoice::kCuda) {
    const int index = env.world_size > 1 ? env.local_rank % gpus : 0;
    // FP8 linears use cuBLASLt's block-scaled e4m3 products (1x128 tiles, 128x128 blocks), which
    // it offers on Hopper; say so before the first product fails deep in a step.
    if (p == PrecisionChoice::kFp8 && cuda_compute_capability(index) != 90) {
      const int cc = cuda_compute_capability(index);
      throw UserError(
          str_cat("train.precision = \"fp8\": needs a compute-capability 9.0 GPU "
                  "(H100, H200: cuBLASLt's block-scaled FP8 products), but cuda:",
                  index, " is ", cuda_device_name(index), " (", cc / 10, ".", cc % 10,
                  "). Hint: train.precision = \"bf16\""));
    }
    return {Device::cuda(index), p == PrecisionChoice::kBf16 || p == PrecisionChoice::kFp8};
  }
  if (backend == CommBackend::kNccl && env.world_size > 1) {
    throw UserError(
        "parallel.backend = \"nccl\": needs a GPU per process, and this node has "
        "none. Hint: parallel.backend=gloo train.device=cpu");
  }
  return {Device::cpu(), false};
}

parallel::CommunicatorFactory communicator_factory(const Config& cfg, Device device) {
  if (device.is_cpu()) {
    return [](parallel::StoreClient& s, const std::string& name, int rank, int size) {
      return parallel::make_gloo_communicator(s, name, rank, size, {});
    };
  }
  if (cfg.parallel.backend == CommBackend::kIpc) {
    parallel::IpcOptions options;
    options.timeout_s = cfg.parallel.ipc_timeout_s;
    return
        [device, options](parallel::StoreClient& s, const std::string& name, int rank, int size) {
          return parallel::make_ipc_communicator(s, name, rank, size, device, options);
        };
  }
  return [device](parallel::StoreClient& s, const std::string& name, int rank, int size) {
    return parallel::make_nccl_communicator(s, name, rank, size, device);
  };
}

}  // namespace internal

}  // namespace gtron
