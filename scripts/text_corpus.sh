#!/usr/bin/env bash
# Writes a reproducible benchmark text of BYTES bytes to OUT, from files every machine of this image
# has: the fortune files (English prose, from the `fortunes` package), then Python 3.11's standard
# library sources (code and docstrings), both in byte order of their paths. Usage:
#   scripts/text_corpus.sh OUT BYTES [SKIP]     (SKIP: start SKIP bytes into that stream)
set -euo pipefail
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
