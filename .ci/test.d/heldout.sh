#!/usr/bin/env bash
# The held-out leak harness of issue 19 (tests/heldout/, frozen at b4cd30e) checks ITSELF
# here: its allocator model reproduces every host, planting is deterministic, every planted
# file is a consistent snapshot that `fragscope replay --verify` matches 100 %. The
# detector's score on it is a report figure (tests/heldout/RESULTS.md), never a gate.
# Hosts only the corpus has are SKIPPED visibly; under CI a missing host fails.
set -euo pipefail
cd "$(dirname "$0")/../.."

# The workspace build, as browser.sh makes it: `-p fragscope` alone unifies features
# differently and would rebuild the dependencies.
cargo build --release
FRAGSCOPE_BIN="$PWD/target/release/fragscope" python3 tests/heldout/test_harness.py
# The late-start harness (tests/heldout/late_start.py, frozen at 000eb61) checks itself too.
FRAGSCOPE_BIN="$PWD/target/release/fragscope" python3 tests/heldout/test_late_start.py
