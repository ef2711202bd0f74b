#!/usr/bin/env bash
# The two benchmark files every speed claim of bench/RESULTS.md is made on (issue 44), one
# of each kind:
#
# * DIR/rep.pickle (427 MB, 6.4 M entries): decomfl's trace repeated by
#   make_large_snapshot.py — the *replicated* kind: its frees do not match its allocations
#   across repetitions and its last entry contradicts the final state, so the analyses
#   that walk back from the final state (memory_summary's table, the report's state view)
#   stop at once;
# * DIR/cons.pickle (391 MB, 6.39 M entries): rep.pickle replayed through fragscope's
#   allocator model and written back (`replay --save-snapshot`) — the *allocator-consistent*
#   kind a long real run writes: segment events present, every free matching its
#   allocation, 114 k blocks live at the end; those walks go through every entry.
#
# usage: bench/make_bench_files.sh [BIN] [DIR]   (default target/release/fragscope, /tmp)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-target/release/fragscope}"
DIR="${2:-/tmp}"
python3 bench/make_large_snapshot.py ../shared/traces/decomfl-opt-zeroth-order-windows.pickle "$DIR/rep.pickle"
"$BIN" replay "$DIR/rep.pickle" --save-snapshot "$DIR/cons.pickle" > /dev/null
ls -l "$DIR/rep.pickle" "$DIR/cons.pickle"
