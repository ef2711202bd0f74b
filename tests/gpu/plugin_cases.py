"""Tests for the pytest plugin on a real GPU (run by tests/gpu/run.sh; not collected by
the project's own test suite). Expected: test_fits passes, test_breaks_reserved and
test_leaks fail with the plugin's message, test_unmarked passes untouched."""

import pytest
import torch

MiB = 2**20
held = []


@pytest.mark.cuda_memory(max_reserved="1GiB", max_allocated="512MiB")
def test_fits():
    x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    (x.float().sum()).item()


@pytest.mark.cuda_memory(max_reserved="100MiB")
def test_breaks_reserved():
    x = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    del x


@pytest.mark.cuda_memory(max_growth="8MiB")
def test_leaks():
    from fragscope.torch import phase

    for _ in range(6):
        with phase("step"):
            held.append(torch.empty(32 * MiB, dtype=torch.uint8, device="cuda"))
            tmp = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda")
            del tmp


def test_unmarked():
    assert torch.cuda.is_available()
