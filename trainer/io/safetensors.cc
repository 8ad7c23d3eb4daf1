#include "trainer/io/safetensors.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "model/check.h"

// The format stores little-endian bytes and we copy tensor memory verbatim.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "gtron safetensors needs a little-endian host");

namespace gtron {
namespace {

// A header larger than this is not a tensor index but a corrupt length field (the official
// implementation uses the same bound).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
// Elements of one tensor, and so the largest dimension: 2^48 (a petabyte of f32) is beyond any
// file, and it keeps numel * element size and every dimension as an int64_t far from overflow.
constexpr uint64_t kMaxElements = 1ull << 48;
// Bytes per fread/fwrite call on the data section.
constexpr size_t kIoChunk = 8u << 20;

// Slicing-by-8 tables: table[0] is the classic byte-at-a-time table; table[k][b] is the CRC of byte
// b followed by k zero bytes, so eight input bytes fold in with eight lookups and no loop-carried
// shift per byte (about 8x the byte-wise speed, which matters for multi-GB checkpoints).
using CrcTables = std::array<std::array<uint32_t, 256>, 8>;

CrcTables make_crc_tables() {
  CrcTables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    t[0][b] = c;
  }
  for (uint32_t b = 0; b < 256; ++b)
    for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xffu];
  return t;
}

const CrcTables& crc_tables() {
  static const CrcTables tables = make_crc_tables();
  return tables;
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

[[noreturn]] void fail(const std::string& path, const std::string& problem,
                       const std::string& hint =
                           "re-create the file from its source, or check "
                           "that the path names a safetensors file") {
  throw UserError(str_cat("safetensors file '", path, "': ", problem, "; hint: ", hint));
}

const char* format_dtype(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF64:
      return "F64";
    case DType::kI32:
      return "I32";
  }
  GTRON_CHECK(false, "unknown dtype");
}

// An on-disk dtype a read accepts and the Tensor dtype it is loaded as.
struct FileDType {
  const char* name;
  size_t bytes;   // per element on disk
  DType load_as;  // != the file's own type only when widening
};

// read_safetensors: gtron's four types as stored. read_safetensors_f32: the float types that widen
// to f32 exactly (F64 does not: narrowing it would round).
constexpr FileDType kNativeTypes[] = {{"F32", 4, DType::kF32},
                                      {"BF16", 2, DType::kBF16},
                                      {"F64", 8, DType::kF64},
                                      {"I32", 4, DType::kI32}};
constexpr FileDType kWidenedTypes[] = {
    {"F32", 4, DType::kF32}, {"BF16", 2, DType::kF32}, {"F16", 2, DType::kF32}};

struct ReadMode {
  const FileDType* begin;
  const FileDType* end;
  const char* allowed;  // for messages
  const char* hint;
};

constexpr ReadMode kNative = {
    std::begin(kNativeTypes), std::end(kNativeTypes), "F32, BF16, F64, I32",
    "convert the tensor to one of these dtypes before loading it into gtron"};
constexpr ReadMode kWidened = {std::begin(kWidenedTypes), std::end(kWidenedTypes),
                               "F32, BF16, F16 (widened exactly to F32)",
                               "gtron imports floating-point weights that widen to F32 exactly; "
                               "convert the tensor to F32, BF16 or F16 (quantized and F64 "
                               "weights are not read)"};

const FileDType* parse_dtype(const std::string& s, const ReadMode& mode) {
  for (const FileDType* t = mode.begin; t != mode.end; ++t)
    if (s == t->name) return t;
  return nullptr;
}

// IEEE half -> float. Every half value (subnormals, infinities, NaN payloads) is a float exactly.
float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  uint32_t u = sign;
  if (exp == 0x1f) {
    u |= 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u |= ((exp + 127 - 15) << 23) | (man << 13);
  } else if (man != 0) {  // subnormal: man * 2^-24, normalized for float
    int e = -14;
    uint32_t m = man;
    while ((m & 0x400u) == 0) {
      m <<= 1;
      --e;
    }
    u |= (static_cast<uint32_t>(e + 127) << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// `n` 16-bit values of on-disk type `type` (BF16 or F16) at `src`, widened into `dst`.
void widen16(const FileDType& type, const char* src, size_t n, float* dst) {
  const bool bf16 = std::strcmp(type.name, "BF16") == 0;
  for (size_t i = 0; i < n; ++i) {
    uint16_t v;
    std::memcpy(&v, src + 2 * i, 2);
    dst[i] = bf16 ? bf16_to_float(BF16{v}) : f16_to_float(v);
  }
}

// One header entry, validated on its own (contiguity is checked across entries later).
struct Entry {
  std::string name;
  const FileDType* dtype;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

Entry parse_entry(const std::string& path, const std::string& name, const nlohmann::ordered_json& v,
                  const ReadMode& mode) {
  const std::string where = str_cat("tensor '", name, "'");
  if (!v.is_object()) fail(path, str_cat(where, " is ", v.type_name(), ", expected an object"));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) fail(path, str_cat(where, " has no \"", key, "\""));
  Entry e;
  e.name = name;
  const auto& dtype = v["dtype"];
  e.dtype = dtype.is_string() ? parse_dtype(dtype.get<std::string>(), mode) : nullptr;
  if (e.dtype == nullptr)
    fail(path, str_cat(where, " has dtype ", dtype.dump(), ", expected one of ", mode.allowed),
         mode.hint);
  const auto& shape = v["shape"];
  if (!shape.is_array() || shape.size() > static_cast<size_t>(Shape::kMaxRank))
    fail(path, str_cat(where, " has shape ", shape.dump(), ", expected an array of at most ",
                       Shape::kMaxRank, " dimensions"));
  uint64_t numel = 1;
  for (const auto& d : shape) {
    if (!d.is_number_unsigned())
      fail(path, str_cat(where, " has shape ", shape.dump(), ", expected non-negative integers"));
    // Each dimension on its own too: beside a zero dimension the product says nothing.
    if (d.get<uint64_t>() > kMaxElements ||
        __builtin_mul_overflow(numel, d.get<uint64_t>(), &numel) || numel > kMaxElements)
      fail(path, str_cat(where, " has shape ", shape.dump(), ", too many elements (at most 2^48)"));
    e.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }
  const auto& offs = v["data_offsets"];
  if (!offs.is_array() || offs.size() != 2 || !offs[0].is_number_unsigned() ||
      !offs[1].is_number_unsigned() || offs[0].get<uint64_t>() > offs[1].get<uint64_t>())
    fail(path, str_cat(where, " has data_offsets ", offs.dump(),
                       ", expected [begin, end] with 0 <= begin <= end"));
  e.begin = offs[0].get<uint64_t>();
  e.end = offs[1].get<uint64_t>();
  const uint64_t want = numel * e.dtype->bytes;
  if (e.end - e.begin != want)
    fail(path, str_cat(where, " spans ", e.end - e.begin, " bytes (data_offsets ", offs.dump(),
                       ") but its shape ", shape.dump(), " of ", e.dtype->name, " needs ", want));
  return e;
}

// Sorts the entries by offsets (stable: entries with equal offsets, i.e. empty tensors, keep their
// header order) and checks that they tile [0, data_bytes) exactly.
void check_layout(const std::string& path, std::vector<Entry>* entries, uint64_t data_bytes) {
  std::stable_sort(entries->begin(), entries->end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  for (const Entry& e : *entries) {
    if (e.begin > at)
      fail(path,
           str_cat("a gap of ", e.begin - at, " bytes before tensor '", e.name,
                   "' (data_offsets begin at ", e.begin, ", previous tensor ends at ", at, ")"));
    if (e.begin < at)
      fail(path,
           str_cat("tensor '", e.name, "' overlaps the previous tensor (data_offsets begin at ",
                   e.begin, ", previous tensor ends at ", at, ")"));
    if (e.end > data_bytes)
      fail(path,
           str_cat("tensor '", e.name, "' ends at data offset ", e.end,
                   ", out of bounds: the file holds only ", data_bytes, " data bytes"),
           "the file was probably cut short; re-create it or use another copy");
    at = e.end;
  }
  if (at != data_bytes)
    fail(path, str_cat("the tensors end at data offset ", at, " but the file holds ", data_bytes,
                       " data bytes (", data_bytes - at, " trailing bytes)"));
}

uint64_t file_size(const std::string& path, std::FILE* f) {
  if (std::fseek(f, 0, SEEK_END) != 0) fail(path, str_cat("cannot seek: ", std::strerror(errno)));
  const long long n = ftello(f);
  if (n < 0) fail(path, str_cat("cannot tell size: ", std::strerror(errno)));
  std::rewind(f);
  return static_cast<uint64_t>(n);
}

void read_exact(const std::string& path, std::FILE* f, void* dst, size_t bytes, const char* what) {
  if (std::fread(dst, 1, bytes, f) != bytes)
    fail(path, str_cat("short read of ", what, " (", bytes, " bytes): ",
                       std::ferror(f) ? std::strerror(errno) : "unexpected end of file"));
}

void write_exact(const std::string& path, std::FILE* f, const void* src, size_t bytes) {
  if (std::fwrite(src, 1, bytes, f) != bytes)
    throw UserError(str_cat("cannot write safetensors file '", path, "': ", std::strerror(errno),
                            "; hint: check free disk space and permissions"));
}

SafetensorsMetadata parse_metadata(const std::string& path, const nlohmann::ordered_json& v) {
  if (!v.is_object())
    fail(path, str_cat("__metadata__ is ", v.type_name(), ", expected an object of strings"));
  SafetensorsMetadata out;
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string())
      fail(path, str_cat("__metadata__[\"", key, "\"] is ", value.dump(), ", expected a string"));
    out[key] = value.get<std::string>();
  }
  return out;
}

// A validated header, the file positioned at the first data byte.
struct Header {
  FilePtr f;
  std::vector<Entry> entries;  // in data order, tiling the data section exactly
  SafetensorsMetadata metadata;
};

// Reads and checks everything before the data section (the policy's list, all but the CRC).
// Nothing is allocated from a size the file states before it is checked against the file's size.
Header read_header(const std::string& path, const ReadMode& mode) {
  Header h;
  h.f.reset(std::fopen(path.c_str(), "rb"));
  if (!h.f) fail(path, str_cat("cannot open: ", std::strerror(errno)), "check the path");
  const uint64_t size = file_size(path, h.f.get());
  if (size < 8)
    fail(path, str_cat("truncated: ", size, " bytes, fewer than the 8-byte header length field"));
  unsigned char len[8];
  read_exact(path, h.f.get(), len, 8, "the header length field");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(len[i]) << (8 * i);
  if (n > size - 8 || n > kMaxHeaderBytes)
    fail(path,
         str_cat("bad header length ", n, ": the file has ", size - 8,
                 " bytes after the length field", n > kMaxHeaderBytes ? " (limit 100 MiB)" : ""),
         "the file is truncated or not a safetensors file");
  std::string text(n, '\0');
  read_exact(path, h.f.get(), text.data(), n, "the header");

  // ordered_json keeps the file's key order, the tie-break between empty tensors at one offset.
  nlohmann::ordered_json header;
  try {
    header = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(path, str_cat("the header is not valid JSON: ", e.what()),
         "the file is corrupt or not a safetensors file");
  }
  if (!header.is_object())
    fail(path, str_cat("the header is a JSON ", header.type_name(), ", expected an object"));
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      h.metadata = parse_metadata(path, value);
    } else {
      h.entries.push_back(parse_entry(path, key, value, mode));
    }
  }
  check_layout(path, &h.entries, size - 8 - n);
  return h;
}

// read_safetensors with the dtypes of `mode`: entries of a widened type are read through a
// staging buffer (the CRC covers the bytes on disk) and widened into f32 tensors.
SafetensorsFile read_file(const std::string& path, const ReadMode& mode) {
  Header h = read_header(path, mode);
  SafetensorsFile out;
  out.metadata = std::move(h.metadata);
  std::FILE* f = h.f.get();
  uint32_t crc = 0;
  std::vector<char> staging;
  for (const Entry& e : h.entries) {
    Tensor t = Tensor::empty(Shape(e.shape), e.dtype->load_as);
    const bool widen = dtype_size(e.dtype->load_as) != e.dtype->bytes;
    const size_t bytes = e.end - e.begin;
    if (widen) staging.resize(std::min(kIoChunk, bytes));
    char* p = static_cast<char*>(t.raw());
    for (size_t done = 0; done < bytes; done += kIoChunk) {
      const size_t chunk = std::min(kIoChunk, bytes - done);
      char* dst = widen ? staging.data() : p + done;
      read_exact(path, f, dst, chunk, str_cat("tensor '", e.name, "'").c_str());
      crc = crc32(dst, chunk, crc);
      if (widen) widen16(*e.dtype, dst, chunk / 2, t.data<float>() + done / 2);
    }
    out.tensors.push_back({e.name, std::move(t)});
  }
  auto stored = out.metadata.find(kSafetensorsCrcKey);
  if (stored != out.metadata.end()) {
    if (stored->second != crc32_hex(crc))
      fail(path,
           str_cat("CRC mismatch: the data section has CRC32 ", crc32_hex(crc),
                   ", the header records ", stored->second),
           "the tensor bytes were altered or damaged on disk; use another copy");
    out.metadata.erase(stored);
  }
  return out;
}

}  // namespace

uint32_t crc32(const void* data, size_t bytes, uint32_t crc) {
  const CrcTables& t = crc_tables();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (; bytes >= 8; bytes -= 8, p += 8) {
    uint32_t lo;
    uint32_t hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
        t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
  }
  for (; bytes > 0; --bytes, ++p) c = (c >> 8) ^ t[0][(c ^ *p) & 0xffu];
  return ~c;
}

std::string crc32_hex(uint32_t crc) {
  char buf[9];
  std::snprintf(buf, sizeof(buf), "%08x", crc);
  return buf;
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const SafetensorsMetadata& metadata) {
  GTRON_CHECK(metadata.count(kSafetensorsCrcKey) == 0, "metadata key ", kSafetensorsCrcKey,
              " is reserved for the writer");
  // ordered_json keeps the header's entries in data order, which makes files easy to read by eye.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::set<std::string> names;
  uint64_t offset = 0;
  uint32_t crc = 0;
  for (const NamedTensor& nt : tensors) {
    GTRON_CHECK(nt.tensor.defined(), "tensor '", nt.name, "' is undefined");
    GTRON_CHECK(nt.tensor.device().is_cpu(), "tensor '", nt.name, "' is on ",
                nt.tensor.device().str(), "; copy it to the CPU first");
    GTRON_CHECK(!nt.name.empty() && nt.name != "__metadata__", "bad tensor name '", nt.name, "'");
    GTRON_CHECK(names.insert(nt.name).second, "tensor name '", nt.name, "' appears twice");
    const uint64_t bytes = nt.tensor.nbytes();
    header[nt.name] = {{"dtype", format_dtype(nt.tensor.dtype())},
                       {"shape", nt.tensor.shape().vec()},
                       {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    if (bytes > 0) crc = crc32(nt.tensor.raw(), bytes, crc);
  }
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  for (const auto& [key, value] : metadata) meta[key] = value;
  meta[kSafetensorsCrcKey] = crc32_hex(crc);
  header["__metadata__"] = meta;

  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // the data section starts 8-byte aligned
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(text.size() >> (8 * i));

  FilePtr f(std::fopen(path.c_str(), "wb"));
  if (!f)
    throw UserError(str_cat("cannot create safetensors file '", path, "': ", std::strerror(errno),
                            "; hint: check that the directory exists and is writable"));
  write_exact(path, f.get(), len, 8);
  write_exact(path, f.get(), text.data(), text.size());
  for (const NamedTensor& nt : tensors) {
    const char* p = static_cast<const char*>(nt.tensor.raw());
    for (size_t done = 0; done < nt.tensor.nbytes(); done += kIoChunk)
      write_exact(path, f.get(), p + done, std::min(kIoChunk, nt.tensor.nbytes() - done));
  }
  if (std::fclose(f.release()) != 0)
    throw UserError(str_cat("cannot write safetensors file '", path, "': ", std::strerror(errno),
                            "; hint: check free disk space and permissions"));
}

SafetensorsFile read_safetensors(const std::string& path) { return read_file(path, kNative); }

SafetensorsFile read_safetensors_f32(const std::string& path) { return read_file(path, kWidened); }

std::vector<SafetensorsEntry> read_safetensors_f32_header(const std::string& path) {
  std::vector<SafetensorsEntry> out;
  for (const Entry& e : read_header(path, kWidened).entries)
    out.push_back({e.name, e.dtype->name, Shape(e.shape)});
  return out;
}

}  // namespace gtron
