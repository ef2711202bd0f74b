#!/usr/bin/env bash
# Checks that a speed change changed no output: runs `summary --json`, `analyze --json`,
# `analyze --json --what-if` and `report` (HTML) with two fragscope binaries on every FILE
# and compares them byte for byte (exit codes too, so refused files must fail alike), then
# the report of the built-in example, of the first two FILEs compared and of every pickle
# at once. With --summary-only, `summary --json` alone. With --all-commands, also every
# other command on every FILE (`replay --verify`, `replay` with its alternatives and role
# what-ifs, `state` at the end by site and by role, `check`, `diff` against the first FILE,
# `export` to Parquet, `oom` on each saved message) and `predict` on the grids.
#
# usage: bench/compare_outputs.sh [--summary-only | --all-commands] OLD_BIN NEW_BIN [FILE...]
#   (default FILEs: ../shared/traces/*, then crates/testdata/real/* when that is absent)
# Prints one line per difference and a count; exits 1 when anything differs.
# EXPORT_ROWS_PY=PYTHON (an interpreter with duckdb): export's tables compared by their
#   rows (bench/compare_exports.py) instead of their bytes, for a change of the writer's
#   encodings or statistics.
# Typical use: cp target/release/fragscope /tmp/fragscope-before before the change.
set -uo pipefail
cd "$(dirname "$0")/.."
summary_only=0 all_commands=0
[ "${1:-}" = --summary-only ] && summary_only=1 && shift
[ "${1:-}" = --all-commands ] && all_commands=1 && shift
[ $# -ge 2 ] || { echo "usage: $0 OLD_BIN NEW_BIN [FILE...]" >&2; exit 2; }
OLD=$1 NEW=$2
shift 2
files=("$@")
if [ ${#files[@]} -eq 0 ]; then
    dir=../shared/traces
    [ -d "$dir" ] || dir=crates/testdata/real
    for f in "$dir"/*; do
        case "$f" in *.md | */reference) continue ;; esac
        files+=("$f")
    done
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
diffs=0 runs=0
same() { # label, then the command's arguments after the binary
    local label=$1
    shift
    "$OLD" "$@" > "$out/old" 2>&1
    local ro=$?
    "$NEW" "$@" > "$out/new" 2>&1
    local rn=$?
    runs=$((runs + 1))
    if [ $ro != $rn ] || ! cmp -s "$out/old" "$out/new"; then
        echo "DIFF $label (exit $ro / $rn)"
        diffs=$((diffs + 1))
    fi
}
report_same() { # label, then the report's arguments
    local label=$1
    shift
    "$OLD" report "$@" -o "$out/old.html" > "$out/old" 2>&1
    local ro=$?
    "$NEW" report "$@" -o "$out/new.html" > "$out/new" 2>&1
    local rn=$?
    runs=$((runs + 1))
    # Written: the pages must be equal; refused: the error messages.
    local a="$out/old.html" b="$out/new.html"
    [ $ro != 0 ] && a="$out/old" b="$out/new"
    if [ $ro != $rn ] || ! cmp -s "$a" "$b"; then
        echo "DIFF report $label (exit $ro / $rn)"
        diffs=$((diffs + 1))
    fi
    rm -f "$out/old.html" "$out/new.html"
}
tables_same() { # old folder, new folder
    if [ -n "${EXPORT_ROWS_PY:-}" ]; then
        "$EXPORT_ROWS_PY" bench/compare_exports.py "$1" "$2" > /dev/null 2>&1
    else
        diff -r "$1" "$2" > /dev/null 2>&1
    fi
}
export_same() { # label, file: the Parquet tables must be equal, or the errors
    local label=$1 f=$2
    # Each binary writes to a folder of the same name, so that the messages naming it match.
    rm -rf "$out/tables" "$out/old.d"
    "$OLD" export "$f" -o "$out/tables" > "$out/old" 2>&1
    local ro=$?
    [ -d "$out/tables" ] && mv "$out/tables" "$out/old.d"
    "$NEW" export "$f" -o "$out/tables" > "$out/new" 2>&1
    local rn=$?
    runs=$((runs + 1))
    if [ $ro != $rn ] || ! cmp -s "$out/old" "$out/new" \
        || { [ $ro = 0 ] && ! tables_same "$out/old.d" "$out/tables"; }; then
        echo "DIFF export $label (exit $ro / $rn)"
        diffs=$((diffs + 1))
    fi
}
pickles=()
for f in "${files[@]}"; do
    b=$(basename "$f")
    same "summary $b" summary --json "$f"
    [ $summary_only = 1 ] && continue
    same "analyze --what-if $b" analyze --json --what-if "$f"
    report_same "$b" "$f"
    if [ $all_commands = 1 ]; then
        same "replay --verify $b" replay --verify --json "$f"
        same "replay $b" replay --json "$f"
        same "replay role what-ifs $b" replay --json --grads-set-to-none --shard-optimizer 4 --checkpoint all "$f"
        same "state $b" state --json "$f"
        same "state --by role $b" state --by role "$f"
        same "check $b" check --no-leaks --max-peak-fragmentation 0.5 "$f"
        same "diff $b" diff --json "${files[0]}" "$f"
        same "analyze text $b" analyze "$f"
        same "summary text $b" summary "$f"
        export_same "$b" "$f"
    fi
    case "$f" in *.pickle | *.pkl) pickles+=("$f") ;; esac
done
if [ $summary_only = 1 ]; then
    echo "compared $runs outputs: $diffs differ"
    [ $diffs -eq 0 ]
    exit
fi
report_same "example"
if [ $all_commands = 1 ]; then
    for m in crates/oomtext/tests/data/oom/*; do
        same "oom $(basename "$m")" oom --json "$m"
    done
    g=../shared/traces/grids
    if [ -d "$g" ]; then
        same "predict kk fwd" predict --json --sizes 128,256 --at 512,1024 "$g"/kk-2.7b-fwd-ctx128-fp32.pickle "$g"/kk-2.7b-fwd-ctx256-fp32.pickle
        same "predict kk step max-fit" predict --sizes 128,256 --capacity 80GB --max-fit "$g"/kk-2.7b-step-ctx128-fp32.pickle "$g"/kk-2.7b-step-ctx256-fp32.pickle
    fi
    h=crates/testdata/h200
    same "predict h200 batch" predict --json --sizes 4,8 --at 16,32 --capacity H100-80GB "$h"/gpt-s512-b4.pickle.gz "$h"/gpt-s512-b8.pickle.gz
fi
[ ${#files[@]} -ge 2 ] && report_same "compare of the first two" "${files[0]}" "${files[1]}"
[ ${#pickles[@]} -ge 1 ] && report_same "all pickles at once" "${pickles[@]}"
echo "compared $runs outputs: $diffs differ"
[ $diffs -eq 0 ]
