"""Mixtures: a 0.7/0.2/0.1 blend of three small shard sets planned by ``tokenmill mix``, its window shares,
the loader's rank/worker split and exact resume over it, sha256 pinning, refusals naming the source, and
``--materialize`` equal to the virtual mixture sample for sample."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.mixture_format import Mixture, MixtureFormatError, Schedule
from pipeline.mixture_plan import plan_mixture
from pipeline.mixture_source import mixture_samples
from pipeline.mixture_spec import parse_mixture_spec
from pipeline.output.shard_set import write_shard_set
from pipeline.problems import SpecError
from service.commands import mix
from training.data import LoaderError, ShardLoader
from training.mixture_data import MixtureLoader
from training.synthetic import SYNTHETIC, random_packed, serve_directory

SEQ, VOCAB = 32, 200
SETS = {"web": (2400, 64), "code": (900, 50), "books": (150, 40)}  # name: (samples, samples per shard)
WEIGHTS = {"web": 0.7, "code": 0.2, "books": 0.1}


def _write(folder: Path, n: int, per_shard: int, seed: int, tokenizer: str = "tok-a", fill: float = 0.95) -> Path:
    write_shard_set(folder, random_packed(n, SEQ, VOCAB, seed=seed, max_doc=12, fill=fill), seq_len=SEQ,
                    vocab_size=VOCAB, samples_per_shard=per_shard, **{**SYNTHETIC, "tokenizer_hash": tokenizer})
    return folder


@pytest.fixture(scope="module")
def sets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sets")
    # books' samples are fuller than code's: token shares are not sample shares
    fills = {"web": 0.9, "code": 0.6, "books": 0.98}
    return {name: _write(root / name, n, per, seed, fill=fills[name])
            for seed, (name, (n, per)) in enumerate(SETS.items())}


def _spec_file(folder: Path, sources: list[dict], **extra) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "mix.yaml"
    path.write_text(yaml.safe_dump({"name": "blend", "seed": 3, "sources": sources, **extra}))
    return path


@pytest.fixture(scope="module")
def mixture_file(sets, tmp_path_factory) -> Path:
    """``tokenmill mix`` of the three sets (books upsampled past one epoch), with relative paths."""
    folder = tmp_path_factory.mktemp("mix")
    for name, path in sets.items():
        shutil.copytree(path, folder / name)
    spec = _spec_file(folder, [{"name": n, "path": n, "weight": w} for n, w in WEIGHTS.items()],
                      total_tokens=60_000)
    out = folder / "out" / "mixture.json"
    assert mix.main([str(spec), "-o", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def mixture(mixture_file) -> Mixture:
    return Mixture.from_json(mixture_file.read_bytes())


def _virtual(mixture_file: Path) -> list[tuple[int, str, np.ndarray]]:
    loader = MixtureLoader(str(mixture_file), 1, num_workers=0, shuffle=False)
    total = loader.schedule.total
    return [(i, key, s.input_ids) for (i, key), s in
            mixture_samples(loader.sources, loader.manifests, loader.mixture, 0, total)]


def test_mix_writes_a_pinned_manifest_not_a_copy(mixture_file, mixture, sets):
    assert [s.name for s in mixture.sources] == list(WEIGHTS)
    assert sorted(p.name for p in mixture_file.parent.iterdir()) == ["mixture.json"]
    for s in mixture.sources:
        assert s.location == f"../{s.name}"  # relative to the mixture file: the two can move together
        assert s.manifest_sha256 == hashlib.sha256((sets[s.name] / "manifest.json").read_bytes()).hexdigest()
        assert s.target_share == pytest.approx(WEIGHTS[s.name])
        assert s.epochs == pytest.approx(s.samples / s.available_samples, abs=1e-6)
    books = mixture.sources[2]
    assert books.epochs > 1  # 6k tokens of books: more than it holds, read again (upsampled)
    assert abs(mixture.total_tokens - 60_000) < 60
    # round trip and a strict schema
    assert Mixture.from_json(mixture.to_json()).to_json() == mixture.to_json()
    bad = json.loads(mixture.to_json())
    bad["sources"][1]["samples"] = "9"
    with pytest.raises(MixtureFormatError, match=r"sources.1 \(code\).samples: must be an integer"):
        Mixture.from_json(json.dumps(bad))


def test_every_1000_sample_window_holds_each_source_within_1_percent_of_its_token_share(mixture_file, mixture):
    virtual = _virtual(mixture_file)
    assert len(virtual) == mixture.total_samples
    src = np.array([i for i, _, _ in virtual])
    tok = np.array([len(ids) for _, _, ids in virtual], dtype=np.float64)
    target = np.array([s.target_share for s in mixture.sources])
    worst = 0.0
    for lo in range(0, len(virtual) - 1000 + 1, 10):
        t = tok[lo:lo + 1000]
        share = np.array([t[src[lo:lo + 1000] == i].sum() for i in range(3)]) / t.sum()
        worst = max(worst, float(np.abs(share - target).max()))
    assert worst <= 0.01, worst
    # and the loader's order (window shuffle on) keeps it: it shuffles each source among its own positions
    loader = MixtureLoader(str(mixture_file), 10, num_workers=0, shuffle_window=256)
    keys = [k for b in loader.epoch_batches() for k in b["keys"]]
    names = [k.split("/")[0] for k in keys]
    assert names == [mixture.sources[i].name for i in src[:len(names)]]
    assert keys != [k for _, k, _ in virtual][:len(keys)]  # shuffled all the same


def test_two_ranks_by_two_workers_get_equal_batches_covering_the_schedule(mixture_file, mixture):
    got = []
    for rank in range(2):
        loader = MixtureLoader(str(mixture_file), 8, rank=rank, world=2, num_workers=2, shuffle_window=64)
        batches = list(loader.epoch_batches())
        assert len(batches) == loader.batches_per_epoch == (mixture.total_samples // 2) // 8
        assert all(b["input_ids"].shape == (8, SEQ) for b in batches)
        assert all(sum(b["source_tokens"]) == b["tokens"] for b in batches)
        got += [k for b in batches for k in b["keys"]]
    want = [k for _, k, _ in _virtual(mixture_file)]
    per_rank = mixture.total_samples // 2 // 8 * 8
    assert sorted(got) == sorted(want[:per_rank] + want[mixture.total_samples // 2:][:per_rank])


def test_stop_at_step_k_and_resume_gives_the_same_remaining_samples(mixture_file):
    def run(loader: MixtureLoader, n: int) -> list[str]:
        out = []
        for b in loader:
            out += b["keys"]
            n -= 1
            if n == 0:
                break
        return out

    full = run(MixtureLoader(str(mixture_file), 8, num_workers=2, shuffle_window=64), 700)  # > 1 epoch
    first = MixtureLoader(str(mixture_file), 8, num_workers=2, shuffle_window=64)
    head = run(first, 217)
    state = json.loads(json.dumps(first.state_dict()))
    second = MixtureLoader(str(mixture_file), 8, num_workers=2, shuffle_window=64)
    second.load_state_dict(state)
    assert head + run(second, 700 - 217) == full
    other = MixtureLoader(str(mixture_file), 8, num_workers=2, shuffle_window=64, seed=1)
    with pytest.raises(LoaderError, match="seed"):
        other.load_state_dict(state)


def test_a_source_with_another_tokenizer_is_refused_naming_it(sets, tmp_path):
    odd = _write(tmp_path / "odd", 100, 50, seed=9, tokenizer="tok-b")
    spec = _spec_file(tmp_path / "s", [{"name": "web", "path": str(sets["web"]), "weight": 0.5},
                                       {"name": "odd", "path": str(odd), "weight": 0.5}])
    with pytest.raises(SpecError, match=r"sources.1: odd and web differ in tokenizer_hash \(tok-b vs tok-a\)"):
        plan_mixture(*_resolved(spec))
    assert mix.main([str(spec), "-o", str(tmp_path / "m.json")]) == 2
    assert not (tmp_path / "m.json").exists()


def _resolved(spec_path: Path):
    from pipeline.mixture_spec import load_mixture_spec

    spec = load_mixture_spec(spec_path)
    return spec, mix.resolve_sources(spec)


def test_max_epochs_exceeded_is_an_error_or_redistributed(sets, tmp_path):
    sources = [{"name": "web", "path": str(sets["web"]), "weight": 0.7, "max_epochs": 1},
               {"name": "code", "path": str(sets["code"]), "weight": 0.3}]
    spec = _spec_file(tmp_path / "a", sources, total_tokens=120_000)
    with pytest.raises(SpecError, match=r"sources.0.max_epochs: web would be read 1.\d+ times, more than max_epochs 1"):
        plan_mixture(*_resolved(spec))
    spec = _spec_file(tmp_path / "b", sources, total_tokens=120_000, fill="redistribute")
    planned = plan_mixture(*_resolved(spec))
    web, code = planned.sources
    assert web.samples == web.available_samples and web.epochs == 1.0  # capped at one epoch
    assert abs(planned.total_tokens - 120_000) < 120  # code made up the difference
    # without total_tokens: as large as one epoch of the limiting source allows
    spec = _spec_file(tmp_path / "c", [{**s, "max_epochs": None} for s in sources])
    planned = plan_mixture(*_resolved(spec))
    assert max(s.epochs for s in planned.sources) == pytest.approx(1.0, abs=1e-3)


def test_spec_errors_name_the_field():
    with pytest.raises(SpecError) as info:
        parse_mixture_spec({"sources": [{"name": "a", "path": "x", "weight": 1, "tokens": 5},
                                        {"name": "b", "weight": -1, "path": "y"}], "fill": "maybe"})
    text = str(info.value)
    assert "sources.0: give exactly one of weight, tokens" in text
    assert "sources.1.weight: Input should be greater than 0" in text
    assert "fill: Input should be 'error' or 'redistribute'" in text


def test_the_loader_checks_each_source_against_what_the_mixture_pinned(mixture_file, tmp_path):
    moved = tmp_path / "copy"
    shutil.copytree(mixture_file.parent.parent, moved)
    copy = moved / "out" / "mixture.json"
    MixtureLoader(str(copy), 4, num_workers=0)  # the folder moved whole: still readable
    manifest = json.loads((moved / "code" / "manifest.json").read_text())
    manifest["extra"] = {"edited": True}
    (moved / "code" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(LoaderError, match="source code: .* the shard set changed since the mixture was made"):
        MixtureLoader(str(copy), 4, num_workers=0)
    shutil.copy(mixture_file.parent.parent / "code" / "manifest.json", moved / "code" / "manifest.json")
    shard = moved / "books" / "shards" / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    data[600] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(LoaderError, match="shard shards/shard-000001.tar: sha256 mismatch"):
        list(MixtureLoader(str(copy), 4, num_workers=0).epoch_batches())


def test_a_mixture_streams_over_http(mixture_file):
    local = [b["keys"] for b in MixtureLoader(str(mixture_file), 8, num_workers=0).epoch_batches()]
    with serve_directory(mixture_file.parent.parent) as url:
        remote = [b["keys"] for b in MixtureLoader(f"{url}/out/mixture.json", 8, num_workers=0).epoch_batches()]
    assert remote == local


def test_materialize_equals_the_virtual_mixture_sample_for_sample(mixture_file, tmp_path):
    out = tmp_path / "flat"
    spec = mixture_file.parent.parent / "mix.yaml"
    assert mix.main([str(spec), "-o", str(tmp_path / "m.json"), "--materialize", str(out)]) == 0
    flat = ShardLoader(str(out), 1, num_workers=0, shuffle=False)
    virtual = _virtual(mixture_file)
    got = [b["input_ids"][0] for b in flat.epoch_batches()]
    assert len(got) == len(virtual) == flat.manifest.total_samples
    for row, (_, _, ids) in zip(got, virtual, strict=True):
        assert row[:len(ids)].tolist() == ids.tolist() and not row[len(ids):].any()
    assert mix.main([str(spec), "-o", str(tmp_path / "m2.json"), "--materialize", str(out)]) == 2  # not empty


def test_schedule_ranges_agree_with_the_whole():
    s = Schedule([7001, 2003, 999], seed=5)
    whole_src, whole_k = s.draws(0, s.total)
    for lo, hi in [(0, 1), (1, 17), (3333, 3334), (9000, 9500), (5000, s.total)]:
        src, k = s.draws(lo, hi)
        assert (src == whole_src[lo:hi]).all() and (k == whole_k[lo:hi]).all()
    for i, c in enumerate(s.counts):
        assert whole_k[whole_src == i].tolist() == list(range(c))  # each source's draws in order, each once


def test_plan_reports_tokens_and_epochs_per_source_and_the_chinchilla_size(mixture_file, mixture, capsys):
    from training.plan import main as plan_main

    assert plan_main(["--data", str(mixture_file), "--json"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(s["name"], s["tokens"], s["epochs"]) for s in record["sources"]] == [
        (s.name, s.tokens, s.epochs) for s in mixture.sources]
    assert record["plan"]["tokens"] == mixture.total_tokens
    assert record["plan"]["params"] == pytest.approx(mixture.total_tokens / 20)  # D = 20 N
    assert plan_main(["--data", str(mixture_file)]) == 0
    table = capsys.readouterr().out
    assert "books" in table and "chinchilla-optimal for the token count" in table


def test_a_token_budget_is_absolute_and_the_weighted_sources_share_the_rest(sets, tmp_path):
    spec = _spec_file(tmp_path / "t", [{"name": "web", "path": str(sets["web"]), "weight": 3},
                                       {"name": "code", "path": str(sets["code"]), "weight": 1},
                                       {"name": "books", "path": str(sets["books"]), "tokens": 2_000}],
                      total_tokens=40_000)
    planned = plan_mixture(*_resolved(spec))
    web, code, books = planned.sources
    assert abs(books.tokens - 2_000) < 40 and books.target_share == pytest.approx(0.05)
    assert web.target_share == pytest.approx(0.95 * 0.75) and code.target_share == pytest.approx(0.95 * 0.25)
    spec = _spec_file(tmp_path / "u", [{"name": "web", "path": str(sets["web"]), "weight": 1},
                                       {"name": "books", "path": str(sets["books"]), "tokens": 50_000}],
                      total_tokens=40_000)
    with pytest.raises(SpecError, match="total_tokens: 40000 leaves nothing for the weighted sources"):
        plan_mixture(*_resolved(spec))
