#!/usr/bin/env bash
# The Python package's tests, as a user installs it: a fresh virtual environment, the
# pinned build/test tools, `pip install .` from the repository root, then pytest over
# python/tests (every real snapshot of ../shared/traces against the CLI's JSON; outside CI
# without that corpus, the in-repository crates/testdata/real/, skips listed by -rs).
set -euo pipefail
cd "$(dirname "$0")/../.."

PY="${PYTHON:-python3}"
VENV=target/py-venv
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -r python/requirements-test.txt
# pip shows the build backend's output only with -v: say what the silent minutes are.
echo "python.sh: pip install . (maturin builds the Rust extension with Cargo's release profile: seconds after the test command's release build, minutes on its own)"
start=$(date +%s)
"$VENV/bin/python" -m pip install --quiet .
echo "python.sh: pip install . took $(( $(date +%s) - start )) s"

# The installed command and `python -m fragscope` run the Rust CLI.
"$VENV/bin/fragscope" --version
"$VENV/bin/python" -m fragscope summary --json > /dev/null
"$VENV/bin/fragscope" summary > /dev/null

# Tests run against the installed package, not the source folder: from another directory.
# pytest exits 5 when it collects nothing; with `set -e` that fails the suite, as it must.
FRAGSCOPE_REPO="$PWD" "$VENV/bin/python" -m pytest -q -ra python/tests "$@"
