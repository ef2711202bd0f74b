#!/usr/bin/env bash
# Browser tests of `fragscope report` in real headless Chromium: Debian's chromium,
# driven by playwright-core (pinned in tests/browser/package-lock.json). Installs what it
# needs on a fresh machine, builds the release binary, and runs tests/browser/*.test.mjs
# on every real file of ../shared/traces, or, outside CI without it (a fresh clone), of
# crates/testdata/real/ (the skipped tests are named in the output).
set -euo pipefail
cd "$(dirname "$0")/../.."

bash .ci/setup-browser
cargo build --release
node --test --test-concurrency=1 tests/browser/report.test.mjs tests/browser/page.test.mjs
