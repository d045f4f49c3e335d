"""The shard loader: batch contents, the per-rank split, deterministic shuffle, exact resume, HTTP
streaming, and checksum failures that name the shard."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds

from pipeline.output.shard_set import write_shard_set
from pipeline.shard_format import Manifest, Sample, encode_sample, iter_tar_samples
from pipeline.shard_reader import read_shard_samples
from training.data import IGNORE_INDEX, LoaderError, ShardLoader, collate
from training.synthetic import SYNTHETIC, random_packed, serve_directory

N_SAMPLES, PER_SHARD, SEQ = 103, 10, 64  # 11 shards, the last one partial (3 samples)


@pytest.fixture(scope="module")
def shardset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    write_shard_set(out, random_packed(N_SAMPLES, SEQ, 300, seed=1, max_doc=40), seq_len=SEQ, vocab_size=300,
                    samples_per_shard=PER_SHARD, **SYNTHETIC)
    return out




def epoch(loader: ShardLoader) -> list[dict]:
    return list(loader.epoch_batches())


def keys(batches: list[dict]) -> list[str]:
    return [k for b in batches for k in b["keys"]]


def test_collate_labels_positions_and_segments():
    ids = np.array([11, 12, 13, 14, 21, 22, 23, 24, 25, 26], dtype=np.uint16)
    mask = np.array([0, 0, 1, 1, 0, 0, 0, 1, 1, 1], dtype=np.uint8)
    b = collate([Sample("k", ids, np.array([4, 6]), mask, {})], seq_len=12, pad_id=7)
    x = IGNORE_INDEX
    assert b["input_ids"].tolist() == [[11, 12, 13, 14, 21, 22, 23, 24, 25, 26, 7, 7]]
    # next token only inside a document and only where the target carries loss
    assert b["labels"].tolist() == [[x, 13, 14, x, x, x, 24, 25, 26, x, x, x]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 1]]
    assert b["cu_seqlens"].tolist() == [0, 4, 10, 12]  # the padding is its own segment
    assert b["seq_ids"].tolist() == [[0] * 4 + [1] * 6 + [2] * 2]
    assert b["max_seqlen"] == 6 and b["tokens"] == 10
    without = collate([Sample("k", ids, np.array([4, 6]), None, {})], seq_len=12, pad_id=7)
    assert without["labels"].tolist() == [[12, 13, 14, x, 22, 23, 24, 25, 26, x, x, x]]


def test_collate_refuses_inconsistent_samples():
    with pytest.raises(LoaderError, match="sample k: 10 tokens, doc_lens sum 9"):
        collate([Sample("k", np.arange(10), np.array([4, 5]), None, {})], 12, 0)
    with pytest.raises(LoaderError, match="token id 40 >= vocab size 40"):
        collate([Sample("k", np.arange(41), np.array([41]), None, {})], 64, 0, vocab_size=40)


@pytest.mark.parametrize("workers", [0, 2])
def test_ranks_get_equal_disjoint_whole_batches(shardset, workers):
    per_rank = []
    for rank in range(2):
        loader = ShardLoader(str(shardset), 4, rank=rank, world=2, num_workers=workers, shuffle_window=16)
        batches = epoch(loader)
        assert loader.batches_per_epoch == len(batches) == (N_SAMPLES // 2) // 4
        assert all(b["input_ids"].shape == (4, SEQ) for b in batches)
        per_rank.append(keys(batches))
    a, b = per_rank
    assert len(a) == len(b) == 48 and len(set(a)) == 48 and not set(a) & set(b)


@pytest.mark.parametrize("batch, per_rank", [(4, 52), (5, 55)])
def test_wrap_gives_every_sample(shardset, batch, per_rank):
    got = []
    for rank in range(2):
        got += keys(epoch(ShardLoader(str(shardset), batch, rank=rank, world=2, num_workers=0, remainder="wrap")))
    # whole batches covering all 103 samples on 2 ranks: ceil(103 / (2 x batch)) batches each
    assert len(got) == 2 * per_rank and len(set(got)) == N_SAMPLES


def test_shuffle_depends_on_seed_and_epoch_only(shardset):
    def order(seed, n_epochs=2, workers=2):
        loader = ShardLoader(str(shardset), 4, seed=seed, num_workers=workers, shuffle_window=16)
        return [keys(epoch(loader)) for _ in range(n_epochs)]

    first, again, other = order(0), order(0), order(1)
    assert first == again
    assert first[0] != first[1]
    # 100 of the 103 samples each epoch; which 3 are dropped changes with the epoch's shard order
    assert len(set(first[0])) == len(set(first[1])) == 100 and len(set(first[0]) | set(first[1])) <= N_SAMPLES
    assert first[0] != other[0]
    no_workers = order(0, 1, workers=0)[0]
    assert sorted(no_workers) == sorted(first[0])  # the split changes the order, never the content
    unshuffled = keys(epoch(ShardLoader(str(shardset), 4, shuffle=False, num_workers=0)))
    assert unshuffled == sorted(unshuffled)[: len(unshuffled)]


@pytest.mark.parametrize("stop", [5, 25, 28])  # mid-epoch, exactly at the epoch end, into epoch 2
def test_resume_mid_epoch_is_exact(shardset, stop):
    def make():
        return ShardLoader(str(shardset), 4, num_workers=2, shuffle_window=7, seed=3)

    ref_loader = make()
    it = iter(ref_loader)
    reference = [next(it) for _ in range(40)]
    assert ref_loader.batches_per_epoch == 25
    first = make()
    it = iter(first)
    head = [next(it) for _ in range(stop)]
    state = first.state_dict()
    del it
    second = make()
    second.load_state_dict(state)
    it = iter(second)
    tail = [next(it) for _ in range(40 - stop)]
    got = head + tail
    assert keys(got) == keys(reference)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(got, reference, strict=True))


def test_resume_refuses_a_different_plan(shardset):
    loader = ShardLoader(str(shardset), 4, num_workers=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    with pytest.raises(LoaderError, match="batch_size 4 -> 2"):
        ShardLoader(str(shardset), 2, num_workers=2).load_state_dict(state)
    with pytest.raises(LoaderError, match="num_workers 2 -> 1"):
        ShardLoader(str(shardset), 4, num_workers=1).load_state_dict(state)


@pytest.mark.parametrize("workers", [0, 2])
def test_http_streaming_gives_exactly_the_local_samples(shardset, workers):
    local = epoch(ShardLoader(str(shardset), 4, rank=1, world=2, num_workers=workers, shuffle_window=16))
    with serve_directory(shardset) as url:
        remote = epoch(ShardLoader(url, 4, rank=1, world=2, num_workers=workers, shuffle_window=16))
    assert keys(remote) == keys(local)
    for a, b in zip(remote, local, strict=True):
        for name in ("input_ids", "labels", "position_ids", "cu_seqlens", "seq_ids"):
            assert torch.equal(a[name], b[name])


@pytest.fixture()
def corrupted(shardset, tmp_path) -> Path:
    bad = tmp_path / "bad"
    shutil.copytree(shardset, bad)
    target = bad / "shards" / "shard-000004.tar"
    data = bytearray(target.read_bytes())
    data[600] ^= 0x01  # one bit inside a sample's token array
    target.write_bytes(bytes(data))
    return bad


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("over_http", [False, True])
def test_corrupted_shard_is_detected_and_named(corrupted, workers, over_http):
    def run(location):
        for rank in range(2):
            epoch(ShardLoader(location, 4, rank=rank, world=2, num_workers=workers))

    with pytest.raises(LoaderError) as err:
        if over_http:
            with serve_directory(corrupted) as url:
                run(url)
        else:
            run(str(corrupted))
    assert "shard shards/shard-000004.tar: sha256 mismatch" in str(err.value)


def test_truncated_missing_and_unusable_sets(shardset, tmp_path):
    short = tmp_path / "short"
    shutil.copytree(shardset, short)
    path = short / "shards" / "shard-000000.tar"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(LoaderError, match="shard-000000.tar: 1000 bytes but the manifest says"):
        epoch(ShardLoader(str(short), 4, num_workers=0, shuffle=False))
    with serve_directory(tmp_path) as url, pytest.raises(LoaderError, match="HTTP 404"):
        ShardLoader(url + "/nothing-here", 4)
    with pytest.raises(LoaderError, match="cannot read"):
        ShardLoader(str(tmp_path / "absent"), 4)
    with pytest.raises(LoaderError, match="too few for 2 rank"):
        ShardLoader(str(shardset), 64, world=2)
    m = Manifest.load(shardset)
    assert m.total_samples == N_SAMPLES and m.shards[-1].partial


def _same(fast: list[Sample], ref: list[Sample]) -> None:
    assert [x.key for x in fast] == [x.key for x in ref]
    for a, b in zip(fast, ref, strict=True):
        assert a.input_ids.dtype == b.input_ids.dtype and np.array_equal(a.input_ids, b.input_ids)
        assert np.array_equal(a.doc_lens, b.doc_lens) and a.meta == b.meta
        assert (a.loss_mask is None) == (b.loss_mask is None)
        if a.loss_mask is not None:
            assert np.array_equal(a.loss_mask, b.loss_mask)


def test_fast_shard_reader_matches_the_contract_decoder(shardset, tmp_path):
    for shard in Manifest.load(shardset).shards:
        data = (shardset / shard.name).read_bytes()
        _same(read_shard_samples(data), list(iter_tar_samples(io.BytesIO(data))))
    masked = tmp_path / "masked"
    m = write_shard_set(masked, random_packed(12, 64, 70000, seed=2, with_mask=True), seq_len=64,
                        vocab_size=70000, samples_per_shard=12, **SYNTHETIC)  # uint32 tokens and loss masks
    data = (masked / m.shards[0].name).read_bytes()
    fast = read_shard_samples(data)
    _same(fast, list(iter_tar_samples(io.BytesIO(data))))
    assert fast[0].input_ids.dtype == np.uint32 and fast[0].loss_mask is not None
    # a key too long for a ustar header makes a pax record: the reference decoder takes over
    buf = io.BytesIO()
    writer = wds.TarWriter(buf, encoder=False, mtime=0)
    sample = encode_sample(0, np.arange(5, dtype=np.uint16), np.array([5]))
    writer.write({**sample, "__key__": "k" * 120})
    writer.close()
    long_key = read_shard_samples(buf.getvalue())
    assert [x.key for x in long_key] == ["k" * 120] and long_key[0].input_ids.tolist() == [0, 1, 2, 3, 4]
    # anything but .npy / .json is refused, on the fast path too
    buf = io.BytesIO()
    writer = wds.TarWriter(buf, encoder=False, mtime=0)
    writer.write({**sample, "payload.pickle": b"\x80\x04."})
    writer.close()
    with pytest.raises(ValueError, match="refusing to decode members"):
        read_shard_samples(buf.getvalue())


def test_a_download_cut_mid_body_is_retried(shardset):
    """The first response for every shard stops early (IncompleteRead): the loader retries, same samples."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    served: set[str] = set()

    class Flaky(SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            if self.path.endswith(".tar") and self.path not in served:
                served.add(self.path)
                self.send_response(200)
                self.send_header("Content-Length", "1000")
                self.end_headers()
                self.wfile.write(b"x" * 10)  # then hang up
                self.close_connection = True
                return
            super().do_GET()

    srv = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Flaky, directory=str(shardset)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        remote = epoch(ShardLoader(url, 4, num_workers=0, shuffle_window=16))
    finally:
        srv.shutdown()
        srv.server_close()
    assert served and keys(remote) == keys(epoch(ShardLoader(str(shardset), 4, num_workers=0, shuffle_window=16)))


def test_loader_workers_collect_garbage_and_ignore_sigterm():
    """Workers fork from a trainer that runs with automatic GC off; they turn it back on, and leave
    SIGTERM to the trainer (which checkpoints)."""
    import gc
    import signal

    from training.data import _worker_init

    before = signal.getsignal(signal.SIGTERM)
    gc.disable()
    try:
        _worker_init(0)
        assert gc.isenabled()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        gc.enable()
        signal.signal(signal.SIGTERM, before)
