// The config's run-time resolution (trainer/config.h): the device and precision "auto" picks,
// gradient accumulation, transient gradients, and the paths a run writes to.
#include <filesystem>

#include "model/check.h"
#include "trainer/config.h"
#include "trainer/config_schema.h"

namespace gtron {

using config_internal::fail;

DeviceChoice resolve_device(const TrainConfig& train, bool cuda_available) {
  if (train.device == DeviceChoice::kCuda && !cuda_available) {
    fail("train.device = \"cuda\": no CUDA device is available on this machine",
         "use train.device = \"auto\" or \"cpu\" to run on the CPU");
  }
  if (train.device == DeviceChoice::kAuto) {
    return cuda_available ? DeviceChoice::kCuda : DeviceChoice::kCpu;
  }
  return train.device;
}

PrecisionChoice resolve_precision(const TrainConfig& train, DeviceChoice resolved_device) {
  GTRON_CHECK(resolved_device != DeviceChoice::kAuto, "resolve the device first");
  const bool cuda = resolved_device == DeviceChoice::kCuda;
  if (train.precision == PrecisionChoice::kAuto) {
    return cuda ? PrecisionChoice::kBf16 : PrecisionChoice::kFp32;
  }
  if (train.precision == PrecisionChoice::kBf16 && !cuda) {
    fail(str_cat(
             "train.precision = \"bf16\": needs a CUDA device, but the run is on cpu (train.device"
             " = \"",
             to_string(train.device), "\")"),
         "use train.precision = \"fp32\" or \"auto\" on CPU");
  }
  return train.precision;
}

int64_t grad_accum_steps(const Config& cfg, int world_size) {
  const int64_t per_step = cfg.train.micro_batch * (world_size / cfg.parallel.tp);
  GTRON_CHECK(world_size >= 1 && cfg.train.global_batch % per_step == 0,
              "call validate() first: global_batch ", cfg.train.global_batch, ", micro_batch ",
              cfg.train.micro_batch, ", world_size ", world_size);
  return cfg.train.global_batch / per_step;
}

bool resolve_transient_grads(const Config& cfg, int world_size) {
  switch (cfg.train.transient_grads) {
    case TransientGradsChoice::kOff:
      return false;
    case TransientGradsChoice::kOn:
      return true;
    case TransientGradsChoice::kAuto:
      break;
  }
  // The conditions validate() puts on true: one capture must hold every write of a step.
  return cfg.graphs.scope == GraphScope::kNone ||
         (cfg.graphs.scope == GraphScope::kFull && grad_accum_steps(cfg, world_size) == 1);
}

std::string checkpoint_dir(const Config& cfg) {
  if (!cfg.checkpoint.dir.empty()) return cfg.checkpoint.dir;
  return (std::filesystem::path(cfg.train.out_dir) / "checkpoints").string();
}

std::string metrics_path(const Config& cfg) {
  const std::filesystem::path file(cfg.log.metrics_file);
  if (file.is_absolute()) return file.string();
  return (std::filesystem::path(cfg.train.out_dir) / file).string();
}

}  // namespace gtron
