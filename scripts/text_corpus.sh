#!/usr/bin/env bash
# Reproducible text from files every machine of this image has. Two forms:
#
#   scripts/text_corpus.sh OUT BYTES [SKIP]
#     A benchmark text of exactly BYTES bytes: the fortune files (English prose, from the
#     `fortunes` package), then Python 3.11's standard library sources (code and docstrings), both
#     in byte order of their paths. SKIP: start SKIP bytes into that stream.
#
#   scripts/text_corpus.sh --jsonl [--unique] OUT [BYTES]
#     A corpus of documents as JSON lines ({"text": ...} a line) for `gtron prepare` and
#     `gtron tokenizer train`: every fortune (the files cut at their "%" lines), then every text
#     file of /usr/share/doc (README, *.txt, *.md, copyright, changelogs, .gz ones decompressed),
#     then every Python 3.11 standard library source file, each group in byte order of its paths;
#     files that are not UTF-8 are left out. BYTES (default: all) stops after the document that
#     reaches that many bytes of text. OUT ending in .gz is gzip-compressed. --unique keeps only
#     the first copy of a document whose text repeats (a third of all the bytes are such copies:
#     licenses and changelogs that many packages ship; all of it: 190 MB, 122 MB
#     unique). Prints the document and byte counts.
set -euo pipefail

if [[ ${1:-} == --jsonl ]]; then
  shift
  unique=0
  if [[ ${1:-} == --unique ]]; then
    unique=1
    shift
  fi
  out=${1:?usage: scripts/text_corpus.sh --jsonl [--unique] OUT [BYTES]}
  limit=${2:-0}
  for d in /usr/share/games/fortunes /usr/share/doc /usr/lib/python3.11; do
    [[ -d $d ]] || { echo "text_corpus: $d is missing (run scripts/setup.sh)" >&2; exit 1; }
  done
  exec /usr/bin/python3 - "$out" "$limit" "$unique" <<'PY'
import gzip, hashlib, json, os, re, sys

out, limit, unique = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"

def files(root, keep):
    found = []
    for d, _, names in os.walk(root):
        found += [os.path.join(d, n) for n in names if keep(n)]
    return sorted(found, key=os.fsencode)  # byte order of the paths

def read(path):
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            return f.read().decode("utf-8")
    except (UnicodeDecodeError, OSError, EOFError):
        return None  # not UTF-8 (or not readable): left out

def documents():
    for path in files("/usr/share/games/fortunes", lambda n: "." not in n):
        text = read(path)
        for doc in re.split(r"^%\r?\n", text or "", flags=re.M):
            yield doc
    doc_file = re.compile(r"^(README.*|.*\.(txt|md)|copyright|changelog.*|NEWS.*)(\.gz)?$",
                          re.I)
    for path in files("/usr/share/doc", lambda n: bool(doc_file.match(n))):
        if not os.path.islink(path):
            yield read(path)
    for path in files("/usr/lib/python3.11", lambda n: n.endswith(".py")):
        yield read(path)

sink = gzip.open(out, "wt", encoding="utf-8") if out.endswith(".gz") else \
    open(out, "w", encoding="utf-8")
count = total = repeats = 0
seen = set()
with sink:
    for doc in documents():
        if doc is None or not doc.strip():
            continue
        if unique:
            digest = hashlib.sha256(doc.encode("utf-8")).digest()
            if digest in seen:
                repeats += 1
                continue
            seen.add(digest)
        sink.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
        count += 1
        total += len(doc.encode("utf-8"))
        if 0 < limit <= total:
            break
summary = {"out": out, "documents": count, "text_bytes": total}
if unique:
    summary["repeats_left_out"] = repeats
print(json.dumps(summary))
PY
fi

out=$1
bytes=$2
skip=${3:-0}
src=(/usr/share/games/fortunes /usr/lib/python3.11)
for d in "${src[@]}"; do
  [[ -d $d ]] || { echo "text_corpus: $d is missing (run scripts/setup.sh)" >&2; exit 1; }
done
{
  find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' -print0 | LC_ALL=C sort -z |
    xargs -0 cat
  find /usr/lib/python3.11 -name '*.py' -type f -print0 | LC_ALL=C sort -z | xargs -0 cat
} 2>/dev/null | tail -c +$((skip + 1)) | head -c "$bytes" >"$out" || true
got=$(stat -c %s "$out")
if [[ $got -ne $bytes ]]; then
  echo "text_corpus: wanted $bytes bytes, the sources gave $got" >&2
  exit 1
fi
