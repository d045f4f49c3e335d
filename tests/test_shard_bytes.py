"""The shard writer's direct tar and .npy layouts are byte for byte what tarfile/webdataset and np.save write."""

from __future__ import annotations

import io

import numpy as np
import pytest

from pipeline import shard_format as sf


def _npy_save(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


def _samples(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(0, 3000))
        ids = rng.integers(0, 65535, k, dtype=np.uint16)
        lens = np.array([k], np.int32) if k else np.zeros(0, np.int32)
        mask = rng.integers(0, 2, k, dtype=np.uint8) if i % 3 == 0 else None
        out.append(sf.encode_sample(i * 7, ids, lens, mask, {"doc_ids": [f"d{i}", "é"], "ords": [i]}))
    return out


@pytest.mark.parametrize("n", [0, 1, 2, 5, 37])
def test_tar_bytes_are_webdataset_bytes(n):
    samples = _samples(n, seed=n)
    assert sf._tar_bytes_direct(samples) == sf._tar_bytes_wds(samples)
    assert sf.tar_bytes(samples) == sf._tar_bytes_wds(samples)
    assert len(sf.tar_bytes(samples)) % (20 * 512) == 0


def test_tar_bytes_round_trip():
    samples = _samples(6)
    got = list(sf.iter_tar_samples(io.BytesIO(sf.tar_bytes(samples))))
    assert len(got) == 6


def test_unusual_members_go_through_tarfile():
    long_key = {"__key__": "k" * 120, "input_ids.npy": b"x"}  # a name over 100 bytes needs a pax header
    unicode_key = {"__key__": "clé", "meta.json": b"{}"}
    for sample in (long_key, unicode_key):
        assert sf._tar_bytes_direct([sample]) is None
        assert sf.tar_bytes([sample]) == sf._tar_bytes_wds([sample])
    with pytest.raises(ValueError):  # webdataset refuses a str value: so does tar_bytes
        sf.tar_bytes([{"__key__": "a", "meta.json": "{}"}])


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "int32", "uint8", "int64", "float32", "bool"])
def test_npy_bytes_are_np_save_bytes(dtype):
    sf._NPY_HEADERS.clear()
    for n in (0, 1, 5, 5, 1000, 1000, 123456):
        a = (np.arange(n) % 7).astype(dtype)
        assert sf.npy_bytes(a) == _npy_save(a)
        assert sf.npy_bytes(a[::2]) == _npy_save(a[::2])  # not contiguous
    b = np.arange(12, dtype=np.int32).reshape(3, 4)
    assert sf.npy_bytes(b) == _npy_save(b)
    assert sf.npy_bytes(b.T) == _npy_save(b.T)
