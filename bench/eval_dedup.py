"""Near-dedup quality on ../shared/corpora/neardup: tokenmill against datasketch MinHashLSH, same run.

Metrics (DESIGN.md, "Measuring dedup quality"), at t = 0.7 and 0.8:
- removal precision / recall / F1 against the connected components ``cc_j{t}`` of the exact-Jaccard
  graph (a component of k documents should lose k-1 of them; removing a singleton is a false positive);
- edge precision / recall: the pairs a method linked directly (after any verification, before union-find)
  against the pairs with J >= t in ``pairs_jaccard``.

Rows, every one with num_perm 128, word 5-gram shingles, seed 1, keeping the first document (by file
order) of each component:
- ``tokenmill`` (the stage's defaults: verify on, bands x rows weighted towards recall) and
  ``tokenmill verify=false``: computed in-process by pipeline.dedup.local, which calls the same kernel,
  band, pair, verification and component functions as the Ray tasks. With ``--ray`` (run it through
  scripts/netns.sh) the real ``near_dedup`` stage also runs on a local Ray and must remove exactly the
  same documents (checked and printed).
- ``datasketch`` : datasketch MinHash (sha1) + MinHashLSH(threshold, num_perm) with its own bands x rows,
  candidates from ``query`` linked directly; ``datasketch same b x r``: MinHashLSH given tokenmill's
  bands x rows.
"""

from __future__ import annotations

import sys  # noqa: I001
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402

import numpy as np  # noqa: E402
from datasketch import MinHash, MinHashLSH  # noqa: E402

from bench.common import CORPORA, emit_json, iter_jsonl  # noqa: E402
from pipeline.dedup import graph as g  # noqa: E402
from pipeline.dedup.local import near_dedup_local  # noqa: E402
from pipeline.dedup.near import NearConfig, NearDedupParams  # noqa: E402


def removal_scores(removed: np.ndarray, comp: list[str]) -> tuple[float, float, float]:
    size = Counter(comp)
    hit = Counter(comp[i] for i in removed)
    correct = sum(min(n, size[c] - 1) for c, n in hit.items())
    should = sum(k - 1 for k in size.values())
    p = correct / len(removed) if len(removed) else 1.0
    r = correct / should if should else 1.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def edge_scores(pred: np.ndarray, true: set[tuple[int, int]]) -> tuple[float, float]:
    got = {(int(min(a, b)), int(max(a, b))) for a, b in pred}
    tp = len(got & true)
    return (tp / len(got) if got else 1.0), (tp / len(true) if true else 1.0)


def datasketch_run(shingles: list[list[bytes]], threshold: float, num_perm: int,
                   params: tuple[int, int] | None) -> tuple[np.ndarray, np.ndarray, tuple[int, int], float]:
    t0 = time.perf_counter()
    hashes = []
    for sh in shingles:
        m = MinHash(num_perm=num_perm, seed=1)
        m.update_batch(sh)
        hashes.append(m)
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm, params=params)
    for i, m in enumerate(hashes):
        if shingles[i]:
            lsh.insert(i, m)
    pairs = {(min(i, j), max(i, j)) for i, m in enumerate(hashes) if shingles[i] for j in lsh.query(m) if j != i}
    edges = np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)
    labels = g.connected_components(edges)
    return edges, np.sort(labels[:, 0]), (lsh.b, lsh.r), time.perf_counter() - t0


def ray_stage_removed(texts: list[str], params: NearDedupParams) -> np.ndarray:
    import ray

    from pipeline.dedup.near import NearDedup
    from pipeline.job.ray_env import init_ray
    from pipeline.job.stats import StageRecorder, StatsActor
    from pipeline.stages.base import StageContext

    init_ray(num_cpus=None)
    rows = [{"id": str(i), "text": t, "source": "neardup", "ord": i, "meta": "{}"} for i, t in enumerate(texts)]
    ds = ray.data.from_items(rows).repartition(8)
    stage = NearDedup(params, StageContext(job_name="eval", output_dir="", stage_index=0, work_dir=""))
    kept = {int(r["ord"]) for r in stage.apply(ds, StageRecorder("near_dedup", StatsActor.remote(), None))
            .select_columns(["ord"]).iter_rows()}
    return np.array(sorted(set(range(len(texts))) - kept), dtype=np.int64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=CORPORA / "neardup", help="folder with the two neardup files")
    ap.add_argument("--thresholds", type=float, nargs="*", default=[0.7, 0.8])
    ap.add_argument("--num-perm", type=int, default=128)
    ap.add_argument("--ray", action="store_true", help="also run the near_dedup stage on a local Ray")
    args = ap.parse_args()
    docs_path, pairs_path = args.data / "neardup_docs.jsonl.gz", args.data / "pairs_jaccard.jsonl.gz"
    if not docs_path.exists() or not pairs_path.exists():
        sys.exit(f"no neardup data in {args.data}: pass --data FOLDER")
    docs = list(iter_jsonl(docs_path))
    index = {d["id"]: i for i, d in enumerate(docs)}
    texts = [d["text"] for d in docs]
    pairs = [(index[p["a"]], index[p["b"]], p["jaccard"]) for p in iter_jsonl(pairs_path)]

    results, checks = {}, {}
    shingles = None
    print(f"{len(docs)} documents, {len(pairs)} pairs with J >= 0.2, num_perm {args.num_perm}")
    print(f"{'t':>4s} {'method':28s} {'b x r':>7s} {'removed':>7s} {'rem P':>6s} {'rem R':>6s} {'rem F1':>6s} "
          f"{'edge P':>6s} {'edge R':>6s} {'sec':>6s}")
    for t in args.thresholds:
        comp = [d[f"cc_j{t:g}"] for d in docs]
        true = {(min(a, b), max(a, b)) for a, b, j in pairs if j >= t}
        rows = {}
        for name, verify in (("tokenmill", True), ("tokenmill verify=false", False)):
            params = NearDedupParams(threshold=t, num_perm=args.num_perm, verify=verify)
            cfg = NearConfig.from_params(params)
            t0 = time.perf_counter()
            res = near_dedup_local(texts, cfg, verify=verify, max_bucket=params.max_bucket)
            rows[name] = (res.edges, res.removed(), (cfg.bands, cfg.rows), time.perf_counter() - t0)
            if verify and args.ray:
                same = np.array_equal(ray_stage_removed(texts, params), res.removed())
                checks[f"ray_stage_equals_local_t{t:g}"] = bool(same)
                print(f"     near_dedup stage on Ray removes the same documents: {same}")
        if shingles is None:
            mh = NearConfig.from_params(NearDedupParams()).hasher()
            shingles = [mh.shingles(x) for x in texts]
        rows["datasketch"] = datasketch_run(shingles, t, args.num_perm, None)
        rows["datasketch same b x r"] = datasketch_run(shingles, t, args.num_perm, rows["tokenmill"][2])
        for name, (edges, removed, br, sec) in rows.items():
            rp, rr, f1 = removal_scores(removed, comp)
            ep, er = edge_scores(edges, true)
            results.setdefault(f"t{t:g}", {})[name] = {
                "removed": int(len(removed)), "removal_p": round(rp, 4), "removal_r": round(rr, 4),
                "removal_f1": round(f1, 4), "edge_p": round(ep, 4), "edge_r": round(er, 4),
                "bands": br[0], "rows": br[1], "seconds": round(sec, 1),
            }
            print(f"{t:4.1f} {name:28s} {br[0]:>3d}x{br[1]:<3d} {len(removed):7d} {rp:6.3f} {rr:6.3f} {f1:6.3f} "
                  f"{ep:6.3f} {er:6.3f} {sec:6.1f}")
    f1_07 = results.get("t0.7", {}).get("tokenmill", {}).get("removal_f1")
    best_peer = max((v["removal_f1"] for k, v in results.get("t0.7", {}).items() if k.startswith("datasketch")),
                    default=None)
    emit_json({
        "bench": "eval_dedup", "results": results, **checks,
        "f1_at_0.7": f1_07, "peer_f1_at_0.7": best_peer, "goal": {"f1_at_0.7": 0.95, "vs_peer": ">="},
    })


if __name__ == "__main__":
    main()
