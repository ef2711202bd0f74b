#!/usr/bin/env bash
# `fragscope export --format parquet` timed against `fragscope summary --json` on the same
# file, and the size of the tables it writes.
#
# usage: bench/bench_export.sh [BIN] [FILE] [REPEAT]
#   BIN     fragscope binary (default target/release/fragscope)
#   FILE    snapshot (default: the reader's 6.4 M-event benchmark file, made once by
#           make_large_snapshot.py from decomfl-opt-zeroth-order-windows.pickle)
#   REPEAT  runs of each command (default 3); each run's wall time and peak RSS is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-target/release/fragscope}"
FILE="${2:-}"
REPEAT="${3:-3}"
if [ -z "$FILE" ]; then
  FILE=/tmp/fragscope-bench-large.pickle
  if [ ! -f "$FILE" ]; then
    python3 bench/make_large_snapshot.py ../shared/traces/decomfl-opt-zeroth-order-windows.pickle "$FILE" --events 6400000
  fi
fi
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
echo "file: $FILE ($(stat -c %s "$FILE") bytes); binary: $BIN; load: $(cut -d' ' -f1-3 /proc/loadavg)"
run() {
  local what=$1; shift
  for i in $(seq "$REPEAT"); do
    /usr/bin/env time -f "$what run $i: %e s wall, %U s user, %M KB peak RSS" "$@" > /dev/null
  done
}
run "summary --json" "$BIN" summary --json "$FILE"
run "export        " "$BIN" export -o "$OUT/t" "$FILE"
echo "tables:"
"$BIN" export --json -o "$OUT/t" "$FILE" | python3 -c '
import json, os, sys
d = json.load(sys.stdin)
total = 0
for t in d["tables"]:
    n = os.path.getsize(t["path"]); total += n
    name, rows = t["name"], t["rows"]
    print(f"  {name:<13} {rows:>10} rows {n/1e6:9.1f} MB")
print(f"  total {total/1e6:.1f} MB")'
