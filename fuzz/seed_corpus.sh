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
# The memory bombs of issue 43 (crates/snapshot/tests/it/limits.rs has them as tests),
# small as they are, so that mutations explore around the reader's limits.
python3 - "$out" <<'PY'
import gzip, io, sys, zipfile
out = sys.argv[1]
d = bytearray(b"\x80\x04}(\x8c\x08segments]\x8c\x04evil]q\x00")
for k in range(1, 65):
    d += bytes([0x30, 0x28, 0x68, k - 1, 0x68, k - 1, 0x6C, 0x71, k])
d += b"u."
sparse = b"\x80\x04N" + b"".join(b"r" + (k << 20).to_bytes(4, "little") for k in range(1, 64)) + b"."
seeds = {
    "bomb-memo-doubling.pickle": bytes(d),
    "bomb-sparse-memo.pickle": sparse,
    "bomb-declared-6gib.pickle.gz": gzip.compress(b"\x80\x04\x8e" + (6 << 30).to_bytes(8, "little") + bytes(1 << 16)),
    "bomb-empty-lists.pickle.gz": gzip.compress(b"\x80\x04" + b"]" * (1 << 20)),
}
# The same doubling as torch.save writes it (a zip archive, stored), plain and gzip'd: read
# from a stream, an archive goes through the spill to a temporary file (spill.rs).
z = io.BytesIO()
with zipfile.ZipFile(z, "w", zipfile.ZIP_STORED) as zf:
    zf.writestr("archive/data.pkl", bytes(d))
seeds["bomb-memo-doubling.pt"] = z.getvalue()
seeds["bomb-memo-doubling.pt.gz"] = gzip.compress(z.getvalue())
for name, data in seeds.items():
    with open(f"{out}/{name}", "wb") as f:
        f.write(data)
print(f"wrote {len(seeds)} memory-bomb seeds")
PY
echo "seeded $n files (<= $max bytes) into $out"
