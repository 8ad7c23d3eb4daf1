#!/usr/bin/env python3
"""Independent checker for safetensors files (standard library only).

Usage: check_safetensors.py FILE [--expect NAME=DTYPE:D0xD1x... ...]

Parses the 8-byte little-endian header length and the JSON header, validates that every tensor's
byte span matches its dtype and shape and that the spans tile the data section exactly, verifies the
gtron CRC32 (__metadata__["gtron.crc32"]) when present, prints one line per tensor
("NAME DTYPE [D0, D1]"), and checks each --expect. A rank-0 tensor is expected as "NAME=F32:" or
"NAME=F32:scalar". Exits 0 when everything holds, 1 with a message on stderr otherwise.

It shares no code with the C++ reader on purpose: it is a second opinion on the format.
"""

import binascii
import json
import struct
import sys

# Element sizes of the safetensors dtypes (the format's full list, not only gtron's).
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}
MAX_HEADER = 100 << 20


class Problem(Exception):
    pass


def parse_expect(spec):
    """'w=F32:3x4' -> ('w', 'F32', [3, 4])."""
    if "=" not in spec or ":" not in spec.split("=", 1)[1]:
        raise Problem(f"bad --expect '{spec}': want NAME=DTYPE:D0xD1 (e.g. w=F32:3x4)")
    name, rest = spec.split("=", 1)
    dtype, dims = rest.split(":", 1)
    if dims in ("", "scalar"):
        return name, dtype, []
    try:
        return name, dtype, [int(d) for d in dims.split("x")]
    except ValueError:
        raise Problem(f"bad --expect '{spec}': dimensions must be integers joined by 'x'")


def is_count(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def check_entry(name, entry):
    """Returns (dtype, shape, begin, end) after checking the entry on its own."""
    if not isinstance(entry, dict):
        raise Problem(f"tensor '{name}' is not an object")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in entry:
            raise Problem(f"tensor '{name}' has no '{key}'")
    dtype, shape, offs = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPE_SIZES:
        raise Problem(f"tensor '{name}' has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(is_count(d) for d in shape):
        raise Problem(f"tensor '{name}' has bad shape {shape!r}")
    if (not isinstance(offs, list) or len(offs) != 2 or not all(is_count(o) for o in offs)
            or offs[0] > offs[1]):
        raise Problem(f"tensor '{name}' has bad data_offsets {offs!r}")
    numel = 1
    for d in shape:
        numel *= d
    if offs[1] - offs[0] != numel * DTYPE_SIZES[dtype]:
        raise Problem(f"tensor '{name}' spans {offs[1] - offs[0]} bytes, but {dtype}{shape} "
                      f"needs {numel * DTYPE_SIZES[dtype]}")
    return dtype, shape, offs[0], offs[1]


def check_file(path):
    """Returns ({name: (dtype, shape)} in data order, metadata) or raises Problem."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise Problem(f"truncated: {len(blob)} bytes, fewer than the 8-byte length field")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8 or n > MAX_HEADER:
        raise Problem(f"bad header length {n}: {len(blob) - 8} bytes follow the length field")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise Problem(f"header is not valid JSON: {e}")
    if not isinstance(header, dict):
        raise Problem("header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise Problem("__metadata__ is not an object of strings")
    entries = sorted(((check_entry(k, v), k) for k, v in header.items()),
                     key=lambda e: (e[0][2], e[0][3]))
    data = blob[8 + n:]
    at = 0
    for (dtype, shape, begin, end), name in entries:
        if begin != at:
            raise Problem(f"tensor '{name}' begins at {begin}, expected {at} (gap or overlap)")
        if end > len(data):
            raise Problem(f"tensor '{name}' ends at {end}, beyond the {len(data)} data bytes")
        at = end
    if at != len(data):
        raise Problem(f"tensors end at {at} but the data section has {len(data)} bytes")
    if "gtron.crc32" in metadata:
        crc = "%08x" % (binascii.crc32(data) & 0xFFFFFFFF)
        if crc != metadata["gtron.crc32"]:
            raise Problem(f"CRC32 of the data is {crc}, header says {metadata['gtron.crc32']}")
    tensors = {name: (dtype, shape) for (dtype, shape, _, _), name in entries}
    return tensors, metadata


def main(argv):
    args = argv[1:]
    if not args or args[0].startswith("--"):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 1
    path, rest = args[0], args[1:]
    try:
        expects = []
        while rest:
            if rest[0] != "--expect" or len(rest) < 2:
                raise Problem(f"unexpected argument {rest[0]!r}; only --expect NAME=DTYPE:SHAPE")
            expects.append(parse_expect(rest[1]))
            rest = rest[2:]
        tensors, metadata = check_file(path)
        for name, (dtype, shape) in tensors.items():
            print(f"{name} {dtype} {shape}")
        for key in sorted(metadata):
            print(f"metadata {key}={metadata[key]}")
        for name, dtype, shape in expects:
            if name not in tensors:
                raise Problem(f"expected tensor '{name}' is missing")
            if tensors[name] != (dtype, shape):
                got = tensors[name]
                raise Problem(f"tensor '{name}' is {got[0]}{got[1]}, expected {dtype}{shape}")
    except (Problem, OSError) as e:
        print(f"check_safetensors: {path}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
