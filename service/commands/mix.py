"""``tokenmill mix SPEC``: plan a mixture of shard sets and write ``mixture.json`` (or, with ``--materialize``,
also an ordinary shard set).

Each source's manifest is read where the trainer will read it (a folder, an object-store URI, an http(s) URL:
``pipeline.shard_source.ShardSource``, with its bounds, checks and API key) and pinned by its sha256; a URL that
redirects (a schedule's ``versions/latest``) is pinned at the version it landed on. Exit codes as ``tokenmill
run``: 2 for a spec or a source that cannot be used (one ``error: field: message`` line each), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipeline import storage
from pipeline.mixture_format import MIXTURE, Mixture
from pipeline.mixture_plan import ResolvedSource, plan_mixture
from pipeline.mixture_spec import MixtureSpec, load_mixture_spec
from pipeline.output.materialize import materialize
from pipeline.problems import SpecError
from pipeline.shard_source import ShardReadError as LoaderError
from pipeline.shard_source import ShardSource
from service.commands.exits import EXIT_FAILURE, EXIT_USAGE, error

_VERSION_URL = re.compile(r"/v1/schedules/([^/]+)/versions/([0-9]+)/artifacts$")
_JOB_URL = re.compile(r"/v1/jobs/([^/]+)/artifacts$")


def pinned_of(location: str) -> dict[str, Any]:
    """What a control-plane artifacts URL names: a job, or a schedule's numbered version."""
    if m := _VERSION_URL.search(location):
        return {"schedule": m.group(1), "version": int(m.group(2))}
    if m := _JOB_URL.search(location):
        return {"job": m.group(1)}
    return {}


def resolve_sources(spec: MixtureSpec, api_key: str | None = None) -> list[ResolvedSource]:
    """Read every source's manifest (SpecError naming the source when one cannot be read)."""
    out = []
    for i, s in enumerate(spec.sources):
        if s.path is None:
            raise SpecError.one(("sources", i), f"{s.name}: a job or schedule reference is resolved by the control "
                                "plane: give its artifacts URL as path, or submit with --server", "mixture")
        source = ShardSource(s.path, bearer_token=api_key)
        try:
            manifest = source.manifest()
        except LoaderError as exc:
            raise SpecError.one(("sources", i, "path"), f"{s.name}: {exc}", "mixture") from None
        out.append(ResolvedSource(s, source.location, manifest, source.manifest_sha256, pinned_of(source.location)))
    return out


def relative_locations(mixture: Mixture, output: str) -> None:
    """Local sources as paths relative to the mixture file's folder, so the two can move together."""
    if storage.is_remote(output):
        return
    folder = os.path.dirname(os.path.abspath(output))
    for s in mixture.sources:
        if "://" not in s.location:
            s.location = os.path.relpath(os.path.abspath(s.location), folder)


def render(mixture: Mixture) -> str:
    return render_rows([asdict(s) for s in mixture.sources])


def render_rows(sources: list[dict[str, Any]]) -> str:
    """A table of the sources (as in mixture.json or the API's answer): share, samples, epochs, tokens, pin."""
    rows = [("source", "target", "samples", "epochs", "tokens", "pinned")]
    for s in sources:
        pin = ",".join(f"{k}={v}" for k, v in s["pinned"].items()) or s.get("manifest_sha256", "")[:12]
        rows.append((s["name"], f"{s['target_share']:.4f}", str(s["samples"]), f"{s['epochs']:.3f}", str(s["tokens"]),
                     pin))
    rows.append(("total", "1", str(sum(s["samples"] for s in sources)), "", str(sum(s["tokens"] for s in sources)),
                 ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenmill mix", description=__doc__.splitlines()[0])
    p.add_argument("spec", help="the mixture spec, YAML or JSON (relative paths resolve against its folder)")
    p.add_argument("--output", "-o", default=MIXTURE, help=f"where to write the mixture file (default ./{MIXTURE})")
    p.add_argument("--materialize", metavar="DIR", help="also write the mixture as an ordinary shard set in DIR")
    p.add_argument("--api-key", default=os.environ.get("TOKENMILL_API_KEY"),
                   help="for http(s) sources on a tokenmill server (default: $TOKENMILL_API_KEY)")
    p.add_argument("--server", help="make the mixture on this tokenmill server (POST /v1/mixtures): sources are "
                                    "its jobs (job: ID) and schedule versions (schedule: ID, version: N|latest)")
    p.add_argument("--json", action="store_true", help="print the mixture file instead of the table")
    return p


def remote(args: argparse.Namespace, spec: MixtureSpec) -> int:
    """``--server``: the server resolves, pins, plans and stores the mixture; prints it and its ``--data`` URL."""
    from service.commands.http_client import Api, ClientError  # lazy: httpx, only to talk to a server

    try:
        api = Api(args.server, args.api_key)
        out = api.request("POST", "/v1/mixtures", json=spec.model_dump(mode="json", exclude_none=True)).json()
    except ClientError as exc:
        return error(str(exc), exc.code)
    if args.json:
        print(json.dumps(out, indent=2), flush=True)
        return 0
    print(render_rows(out["sources"]), flush=True)
    print(f"mixture {out['id']}: --data {args.server.rstrip('/')}{out['data']}", flush=True)
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        spec = load_mixture_spec(args.spec)
        if args.server:
            return remote(args, spec)
        mixture = plan_mixture(spec, resolve_sources(spec, args.api_key))
    except SpecError as exc:
        return error(str(exc))
    relative_locations(mixture, args.output)
    text = mixture.to_json()
    try:
        storage.write_text(args.output, text)
    except OSError as exc:
        return error(f"{args.output}: {exc}", EXIT_FAILURE)
    print(text if args.json else render(mixture), flush=True)
    if args.materialize:
        try:
            manifest = materialize(str(Path(args.output).resolve()) if not storage.is_remote(args.output)
                                   else args.output, args.materialize, bearer_token=args.api_key)
        except LoaderError as exc:
            return error(str(exc), EXIT_USAGE)
        print(json.dumps({"materialized": args.materialize, "samples": manifest.total_samples,
                          "tokens": manifest.total_tokens, "shards": len(manifest.shards)}), flush=True)
    return 0


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))

