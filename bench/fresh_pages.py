#!/usr/bin/env python3
"""How fast this machine hands a process fresh memory: a 512 MiB anonymous mapping written
once per 4 KiB page, with transparent huge pages asked for (`hp`) or refused (`4k`).
Run it twice, once right after another run and once after a pause: on VMs that report
freed memory back to their host (virtio-balloon), the first write to reported pages costs
the host a fault too (bench/RESULTS.md, third session of 7 Dec).

usage: fresh_pages.py hp|4k [LABEL]
"""
import mmap
import sys
import time

SIZE = 512 << 20


def main():
    kind = sys.argv[1] if len(sys.argv) > 1 else "hp"
    label = sys.argv[2] if len(sys.argv) > 2 else ""
    m = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE if kind == "hp" else mmap.MADV_NOHUGEPAGE)
    t = time.perf_counter()
    for i in range(0, SIZE, 4096):
        m[i] = 1
    dt = time.perf_counter() - t
    print(f"{kind} {label} {SIZE / dt / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
