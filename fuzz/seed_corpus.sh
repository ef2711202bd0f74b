#!/bin/sh
# Seeds fuzz/corpus/read_snapshot with the small real snapshots from ../shared/traces.
# The traces are never committed (several have no licence): they are copied here at run
# time only, into a folder that .gitignore excludes.
#   usage: fuzz/seed_corpus.sh [max_bytes]   (default 100000)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
traces="$here/../../shared/traces"
max=${1:-100000}
out="$here/corpus/read_snapshot"
if [ ! -d "$traces" ]; then
    echo "no $traces: nothing to seed" >&2
    exit 1
fi
mkdir -p "$out"
n=0
for f in "$traces"/*.pickle "$traces"/*.pkl "$traces"/*.json "$traces"/*.gz; do
    [ -f "$f" ] || continue
    size=$(wc -c < "$f")
    if [ "$size" -le "$max" ]; then
        cp "$f" "$out/$(basename "$f")"
        n=$((n + 1))
    fi
done
echo "seeded $n files (<= $max bytes) into $out"
