#!/usr/bin/env bash
# Checks that a speed change changed no output: runs `summary --json`, `analyze --json`,
# `analyze --json --what-if` and `report` (HTML) with two fragscope binaries on every FILE
# and compares them byte for byte (exit codes too, so refused files must fail alike), then
# the report of the built-in example, of the first two FILEs compared and of every pickle
# at once. With --summary-only, `summary --json` alone.
#
# usage: bench/compare_outputs.sh [--summary-only] OLD_BIN NEW_BIN [FILE...]
#   (default FILEs: ../shared/traces/*, then crates/testdata/real/* when that is absent)
# Prints one line per difference and a count; exits 1 when anything differs.
# Typical use: cp target/release/fragscope /tmp/fragscope-before before the change.
set -uo pipefail
cd "$(dirname "$0")/.."
summary_only=0
[ "${1:-}" = --summary-only ] && summary_only=1 && shift
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
pickles=()
for f in "${files[@]}"; do
    b=$(basename "$f")
    same "summary $b" summary --json "$f"
    [ $summary_only = 1 ] && continue
    same "analyze --what-if $b" analyze --json --what-if "$f"
    report_same "$b" "$f"
    case "$f" in *.pickle | *.pkl) pickles+=("$f") ;; esac
done
if [ $summary_only = 1 ]; then
    echo "compared $runs outputs: $diffs differ"
    [ $diffs -eq 0 ]
    exit
fi
report_same "example"
[ ${#files[@]} -ge 2 ] && report_same "compare of the first two" "${files[0]}" "${files[1]}"
[ ${#pickles[@]} -ge 1 ] && report_same "all pickles at once" "${pickles[@]}"
echo "compared $runs outputs: $diffs differ"
[ $diffs -eq 0 ]
