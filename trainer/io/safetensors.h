// safetensors files: named CPU tensors plus string metadata, in the format PyTorch/Hugging Face
// tools read (https://github.com/huggingface/safetensors, "Format" section).
//
// Layout (all integers little-endian):
//   [8 bytes]  u64 N, the header length
//   [N bytes]  JSON: {"<name>": {"dtype": "F32", "shape": [d0, ...], "data_offsets": [begin, end]},
//                     ..., "__metadata__": {"<key>": "<string value>", ...}}
//              padded with spaces so that 8 + N is a multiple of 8 (the data section starts
//              aligned)
//   [rest]     the raw tensor bytes, tensors back to back in the order given to the writer; offsets
//              are relative to the start of this section
//
// Policy:
// - read_safetensors loads the four gtron dtypes as stored: F32, BF16, F64, I32. A file with any
//   other dtype is a UserError naming the tensor and its dtype (gtron could not hold it in a
//   Tensor), as is a rank above Shape::kMaxRank.
// - read_safetensors_f32 (imported weights) loads F32, BF16 and F16, each widened exactly to f32:
//   a bf16 value is the top half of its float, and every IEEE half (subnormals, infinities, NaN
//   payloads) is a float. Files may mix these dtypes. Any other dtype is a UserError naming the
//   tensor and its dtype; that includes F64, which would round on the way to f32.
// - Integrity: the writer stores the CRC32 (IEEE) of the whole data section, as 8 lowercase hex
//   digits, in __metadata__["gtron.crc32"]; the reader verifies it when present (files written by
//   other tools have none) and removes it from the metadata it returns, so a write/read round trip
//   gives back exactly the metadata that was written.
// - The reader trusts nothing: header length within the file (and at most 100 MiB), JSON well
//   formed, every entry typed, dtype known, rank at most Shape::kMaxRank, every dimension and
//   numel at most 2^48, numel * element size == the entry's byte span, spans contiguous from 0
//   with no gap or overlap, and file size == 8 + N + data size. Any violation is a UserError naming
//   the file, the tensor and the field. All of it is checked before a tensor is allocated, so
//   nothing is allocated in proportion to a size the file states but does not hold: what a read
//   allocates is bounded by the file's size (twice it for a widened 16-bit tensor). It reads
//   tensor bytes straight into their tensors (no second copy of the data).
// - Writes go straight to `path`; atomicity is the job of the caller (checkpoint_io writes into a
//   temporary directory that is renamed into place).
//
// Thread safety: the functions share no state; concurrent calls on different paths are safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/tensor.h"

namespace gtron {

struct NamedTensor {
  std::string name;
  Tensor tensor;  // CPU, contiguous (any view of CPU storage is)
};

using SafetensorsMetadata = std::map<std::string, std::string>;

struct SafetensorsFile {
  std::vector<NamedTensor> tensors;  // in data order (the writer's order)
  SafetensorsMetadata metadata;      // without "gtron.crc32"
};

// The metadata key holding the data section's CRC32.
inline constexpr char kSafetensorsCrcKey[] = "gtron.crc32";

// REQUIRES: every tensor defined and on the CPU; names unique, non-empty and not "__metadata__";
// `metadata` does not hold kSafetensorsCrcKey (the writer owns it).
// Throws UserError when the file cannot be written (naming the path and the OS error).
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const SafetensorsMetadata& metadata = {});

// Reads and validates a whole file into fresh CPU tensors. Throws UserError on any problem.
SafetensorsFile read_safetensors(const std::string& path);

// read_safetensors, but every tensor comes back f32: F32 as is, BF16 and F16 widened exactly; any
// other dtype is a UserError naming the tensor and dtype. Validation is read_safetensors' (the CRC
// covers the bytes on disk).
SafetensorsFile read_safetensors_f32(const std::string& path);

// One tensor as its header entry describes it.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // as on disk: "F32", "BF16", "F16"
  Shape shape;
};

// The tensors read_safetensors_f32 would load from `path`, in data order, from the header alone:
// every check of read_safetensors_f32 but the CRC (which needs the data) passes first, and no
// tensor is allocated. For callers that check sizes from another file (a Hugging Face
// config.json) against the shapes before allocating a model. Throws UserError.
std::vector<SafetensorsEntry> read_safetensors_f32_header(const std::string& path);

// CRC-32 with the IEEE 802.3 polynomial (reflected 0xEDB88320, init and final xor 0xFFFFFFFF), the
// same value as zlib's crc32() and Python's binascii.crc32(). Chain calls by passing the previous
// result as `crc`: crc32(b, nb, crc32(a, na)) == crc32 of a followed by b.
uint32_t crc32(const void* data, size_t bytes, uint32_t crc = 0);

// "1a2b3c4d": the 8-digit lowercase hex form stored in metadata and manifests.
std::string crc32_hex(uint32_t crc);

}  // namespace gtron
