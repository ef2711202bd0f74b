"""The reader's memory budget from Python (issue 43; docs/limits.md): crafted pickles and
shared containers raise fragscope.SnapshotError with one line naming the limit, never
abort the interpreter."""

import gzip

import pytest

import fragscope


def _doubling_pickle(levels: int = 64) -> bytes:
    """{'segments': [], 'evil': L_levels}, L_k = [L_{k-1}, L_{k-1}] shared via the memo."""
    body = bytearray(b"\x80\x04}(\x8c\x08segments]\x8c\x04evil]q\x00")
    for k in range(1, levels + 1):
        body += bytes([ord("0"), ord("("), ord("h"), k - 1, ord("h"), k - 1, ord("l"), ord("q"), k])
    body += b"u."
    return bytes(body)


def test_a_memo_doubling_raises_snapshot_error():
    for data in (_doubling_pickle(), gzip.compress(_doubling_pickle())):
        with pytest.raises(fragscope.SnapshotError) as e:
            fragscope.loads(data)
        msg = str(e.value)
        assert "refusing: the snapshot's values, memo references copied" in msg, msg
        assert "\n" not in msg


def test_shared_lists_in_a_dict_raise_snapshot_error():
    # The same structure built in Python: from_dict shares what Python shares, and the
    # model's copies are bounded as they are for a pickle.
    leaf = []
    for _ in range(64):
        leaf = [leaf, leaf]
    with pytest.raises(fragscope.SnapshotError) as e:
        fragscope.from_dict({"segments": [], "evil": leaf})
    assert "memo references copied" in str(e.value)


def test_a_declared_huge_string_raises_snapshot_error():
    data = b"\x80\x04\x8e" + (6 << 30).to_bytes(8, "little") + bytes(1 << 20)
    with pytest.raises(fragscope.SnapshotError) as e:
        fragscope.loads(gzip.compress(data))
    assert "longer than any memory snapshot holds (limit 64 MiB)" in str(e.value)
