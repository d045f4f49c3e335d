"""Driver memory of exact_dedup + near_dedup on Ray: its peak must stay flat when the corpus grows 4x.

For each size a fresh driver process (this script with --child) starts a local Ray, reads JSONL files
with Ray Data (documents never pass through the driver), runs exact_dedup then near_dedup, streams the
result to count it, and reports its own peak RSS (ru_maxrss). The corpus: ~2 KB windows of
../shared/corpora English text (or --data) with a serial number appended, cycling through the windows
available (so the 4x corpus also holds more near-duplicates: more pairs, larger components), a tenth
repeated verbatim and a tenth with one word edited, written as JSONL files in a temp folder.
Run through scripts/netns.sh.
"""

from __future__ import annotations

import sys  # noqa: I001
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from bench.common import default_paths, emit_json, read_texts  # noqa: E402
from bench.minhash import windows  # noqa: E402

FILES = 8


def write_corpus(folder: Path, docs: int, base: list[str]) -> int:
    """Write ``docs`` documents over FILES JSONL files; returns the bytes written."""
    rng = random.Random(docs)
    folder.mkdir(parents=True, exist_ok=True)
    per_file = -(-docs // FILES)
    total = 0
    for f in range(FILES):
        with open(folder / f"part-{f}.jsonl", "w", encoding="utf-8") as out:
            for r in range(min(per_file, docs - f * per_file)):
                k = f * per_file + r
                text = base[k % len(base)] + f" {k}" if k % 10 else base[(k // 10) % len(base)]
                if k % 10 == 5:
                    words = text.split()
                    words[rng.randrange(len(words))] = "edited"
                    text = " ".join(words)
                line = json.dumps({"id": f"d{k}", "text": text, "source": f"part-{f}", "ord": (f << 40) | r,
                                   "meta": "{}"})
                total += len(line) + 1
                out.write(line + "\n")
    return total


def child(folder: Path, out_dir: Path) -> None:
    import ray

    from pipeline.dedup.exact import ExactDedup, ExactDedupParams
    from pipeline.dedup.near import NearDedup, NearDedupParams
    from pipeline.job.ray_env import init_ray
    from pipeline.job.stats import StageRecorder, StatsActor
    from pipeline.stages.base import StageContext

    init_ray(num_cpus=None)
    t0 = time.perf_counter()
    ds = ray.data.read_json(sorted(str(p) for p in folder.glob("*.jsonl")))
    actor = StatsActor.remote()
    ctx = StageContext(job_name="mem", output_dir=str(out_dir), stage_index=0, work_dir=str(out_dir))
    for cls, params in ((ExactDedup, ExactDedupParams()), (NearDedup, NearDedupParams(threshold=0.8))):
        ds = cls(params, ctx).apply(ds, StageRecorder(cls.name, actor, str(out_dir / "rejected")))
    kept = sum(len(b["ord"]) for b in ds.iter_batches(batch_size=4096, batch_format="numpy"))
    stats = ray.get(actor.snapshot.remote())
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"kept": kept, "peak_mb": round(peak_mb, 1), "seconds": round(time.perf_counter() - t0, 1),
                      "dropped": {k: v["dropped"] for k, v in stats.items()}}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", nargs="*", type=Path, help="JSONL(.gz) files with a text field")
    ap.add_argument("--docs", type=int, default=15000, help="documents of the small corpus (the big one: 4x)")
    ap.add_argument("--child", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    paths = args.data or default_paths("english/manpages_en.jsonl.gz", "english/python_docs.jsonl.gz",
                                       "english/usr_share_doc.jsonl.gz")
    if not paths:
        sys.exit("no data: pass --data FILE.jsonl.gz (../shared/corpora not found)")
    base = windows(read_texts(paths, limit_bytes=12_000_000), 2048, 4 * args.docs)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (args.docs, 4 * args.docs):
            folder, out = Path(tmp) / f"in-{n}", Path(tmp) / f"out-{n}"
            nbytes = write_corpus(folder, n, base)
            proc = subprocess.run([sys.executable, __file__, "--child", str(folder), str(out)],
                                  capture_output=True, text=True, check=False)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode or not lines:
                sys.exit(f"driver for {n} documents failed:\n{proc.stderr[-3000:]}")
            res = json.loads(lines[-1])
            results.append({"docs": n, "input_mb": round(nbytes / 1e6, 1), **res})
    print(f"{'docs':>8s} {'input MB':>9s} {'kept':>8s} {'driver peak RSS MB':>19s} {'seconds':>8s}")
    for r in results:
        print(f"{r['docs']:8d} {r['input_mb']:9.1f} {r['kept']:8d} {r['peak_mb']:19.1f} {r['seconds']:8.1f}")
    ratio = results[1]["peak_mb"] / results[0]["peak_mb"]
    print(f"corpus x{results[1]['input_mb'] / results[0]['input_mb']:.1f}: driver peak x{ratio:.2f}")
    emit_json({"bench": "dedup_memory", "docs": [r["docs"] for r in results],
               "input_mb": [r["input_mb"] for r in results],
               "driver_peak_mb": [r["peak_mb"] for r in results], "ratio": round(ratio, 3),
               "goal": "ratio <= 1.25 for a 4x corpus"})


if __name__ == "__main__":
    main()
