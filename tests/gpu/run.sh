#!/usr/bin/env bash
# The checks that need a CUDA device (tests/gpu/README.md). Run on a machine with torch and
# a GPU, with fragscope's wheel in WHEELDIR:  bash tests/gpu/run.sh WHEELDIR OUTDIR
set -uo pipefail
WHEELDIR=$1; OUT=$2; mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fs-site "$WHEELDIR"/fragscope-*.whl || exit 3
export PYTHONPATH=/tmp/fs-site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch, fragscope; print("torch", torch.__version__, "fragscope", fragscope.__version__, torch.cuda.get_device_name())'
R=$OUT/rec; mkdir -p "$R"
rec() { name=$1; shift; echo "== record $name: $*"; timeout 120 python3 tests/gpu/record.py --out "$R/$name.pickle" "$@" | tail -1 | cut -c1-400; }
for b in 4 8 16 32; do rec "gpt-s512-b$b" --batch "$b"; done
for s in 256 1024; do rec "gpt-s$s-b8" --batch 8 --seq "$s"; done
rec gpt-s512-b16-ckpt --batch 16 --checkpoint
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True rec gpt-s512-b16-expandable --batch 16
for b in 4 8 16; do rec "gpt-s512-b$b-amp" --batch "$b" --amp; done
echo "== pytest plugin"
timeout 120 python3 -m pytest -p no:cacheprovider -rA --fragscope-keep-snapshots="$OUT/plugin" tests/gpu/plugin_cases.py > "$OUT/plugin.log" 2>&1
tail -60 "$OUT/plugin.log"
# The outcomes plugin_cases.py's docstring expects, and no warning from the plugin's hooks.
for want in "PASSED tests/gpu/plugin_cases.py::test_fits" "FAILED tests/gpu/plugin_cases.py::test_breaks_reserved" \
            "FAILED tests/gpu/plugin_cases.py::test_leaks" "PASSED tests/gpu/plugin_cases.py::test_unmarked"; do
    if grep -q "^$want" "$OUT/plugin.log"; then echo "CHECK plugin: $want: ok"; else echo "CHECK plugin: $want: FAIL"; fi
done
if grep -q "PluggyTeardownRaisedWarning" "$OUT/plugin.log"; then echo "CHECK plugin: no hook warning: FAIL"; else echo "CHECK plugin: no hook warning: ok"; fi
echo "== live"
timeout 240 python3 tests/gpu/live.py "$OUT/live"
echo "live rc $?"
(cd "$OUT" && tar czf rec.tgz rec && tar czf live.tgz live plugin 2>/dev/null; rm -rf rec live plugin; ls -la)
