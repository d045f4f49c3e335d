"""README.md and the guide are executable: their runnable blocks run here as written (issues 22 and 39).

``tests/readme_blocks.py`` reads the blocks and their markers, README.md first, then ``docs/`` in the guide's
order. Each scenario runs in a scratch folder as one bash script with ``.venv/bin`` first on ``PATH`` (so
``tokenmill`` and ``.venv/bin/tokenmill`` are the same program), the inputs it expects generated there, and the
repository's ``.venv`` and ``training/`` linked in (the commands name ``.venv/bin/...`` and
``training/configs/...`` from the repository's root). A wrong flag, an empty key or a command that fails stops the
script (``set -euo pipefail``) and fails the test with the page and line it came from.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests import readme_blocks as rb
from tests.demo_install import demo_install_env

REPO = Path(__file__).resolve().parents[1]

WORDS = ("the of and to in is that it was for on are as with his they at be this from have or by one had not but "
         "what all were when we there can an your which their said if do will each about how up out them then she "
         "many some so these would other into has more her two like him see time could no make than first been its "
         "who now people my made over did down only way find use may water long little very after words called just "
         "where most know river garden market winter station letter morning village teacher window kitchen doctor "
         "history music summer forest mountain island harbor bridge engine library theatre castle valley").split()


def _doc(rng: random.Random, sentences: int) -> str:
    out = []
    for _ in range(sentences):
        words = [rng.choice(WORDS) for _ in range(rng.randint(8, 16))]
        out.append(" ".join(words).capitalize() + ".")
    return " ".join(out)


def _run(scenario: rb.Scenario, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """The scenario's files laid out, then its commands as one script; killed as a process group afterwards
    (a server the README starts in the background included)."""
    for rel, text in scenario.files.items():
        (cwd / rel).parent.mkdir(parents=True, exist_ok=True)
        (cwd / rel).write_text(text, encoding="utf-8")
    (cwd / ".venv").symlink_to(REPO / ".venv")
    (cwd / "training").symlink_to(REPO / "training")
    script = cwd / "readme.sh"
    script.write_text("set -euo pipefail\n" + scenario.script(), encoding="utf-8")
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENMILL_") or k == "TOKENMILL_IN_NETNS"}
    env |= {"PATH": f"{venv_bin}{os.pathsep}{env.get('PATH', '')}", "PYTHONUNBUFFERED": "1", "TERM": "dumb"}
    env = demo_install_env(env)  # only what `make demo` installs may be imported (issue 39)
    proc = subprocess.Popen(["bash", str(script)], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the guide's {scenario.name} commands ran past {timeout} s\n{out[-4000:]}\n{err[-4000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    (cwd / "readme.out").write_text(out + "\n--- stderr\n" + err, encoding="utf-8")  # to read after a failure
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert result.returncode == 0, (f"the guide's {scenario.name} commands failed ({result.returncode})\n"
                                    f"--- stdout\n{out[-6000:]}\n--- stderr\n{err[-6000:]}")
    return result


# ---- the markers -----------------------------------------------------------------------------------------------


def test_every_runnable_block_of_the_readme_and_the_guide_has_a_marker():
    found = rb.all_blocks()
    assert {b.page for b in found} >= {"README.md", "docs/jobs.md", "docs/control-plane.md"}
    unmarked = rb.unmarked_blocks(found)
    assert unmarked == [], "runnable blocks with no `<!-- readme: run|file|skip ... -->` marker: " + ", ".join(
        b.where for b in unmarked)
    skipped = [b for b in found if b.action == "skip"]
    assert all(b.args and len(b.args[0]) > 20 for b in skipped), "a skipped block must say why"
    assert {"own-job", "control-plane"} <= set(rb.scenarios(found))


def test_the_marker_parser_finds_unmarked_blocks_and_groups_scenarios():
    text = ("intro\n<!-- readme: run a -->\n```bash\necho 1\n```\n```bash\necho unmarked\n```\n"
            "<!-- readme: file a x/job.yaml -->\n```yaml\nk: v\n```\n<!-- readme: run a -->\n```bash\necho 2\n```\n"
            "<!-- readme: skip needs a cluster of its own -->\n```bash\nray up\n```\n```yaml\nnot: a command\n```\n")
    assert [b.line for b in rb.unmarked_blocks(rb.blocks(text))] == [6]
    sc = rb.scenarios(rb.blocks(text))["a"]
    assert sc.files == {"x/job.yaml": "k: v\n"}
    assert [b.text for b in sc.commands] == ["echo 1\n", "echo 2\n"]
    assert "# README.md line 3\necho 1" in sc.script()
    with pytest.raises(ValueError, match="README.md line 2: 'file' takes a scenario and a path"):
        rb.scenarios(rb.blocks("<!-- readme: file a -->\n```yaml\nk: v\n```\n"))


def test_the_parser_reads_the_guide_in_order_names_its_pages_and_runs_python_blocks(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("<!-- readme: run a -->\n```bash\necho readme\n```\n")
    (tmp_path / "docs" / "aaa-extra.md").write_text("<!-- readme: run a -->\n```bash\necho extra\n```\n")
    (tmp_path / "docs" / "training.md").write_text(
        "text\n<!-- readme: run a -->\n```python\nimport sys\nprint(sys.version)\n```\n"
        "```python\nprint('nobody runs this')\n```\n")
    (tmp_path / "docs" / "jobs.md").write_text("<!-- readme: run a -->\n```sh\necho jobs\n```\n")
    assert [p.name for p in rb.pages(tmp_path)] == ["README.md", "jobs.md", "training.md", "aaa-extra.md"]
    found = rb.all_blocks(tmp_path)
    assert [b.where for b in rb.unmarked_blocks(found)] == ["docs/training.md line 7"]
    script = rb.scenarios(found)["a"].script()
    assert script.index("echo readme") < script.index("echo jobs") < script.index("import sys") < script.index(
        "echo extra")
    assert "# docs/training.md line 3\npython - <<'PY'\nimport sys\nprint(sys.version)\nPY\n" in script
    ran = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})
    assert ran.returncode == 0 and ran.stdout.splitlines()[:2] == ["readme", "jobs"], ran
    with pytest.raises(ValueError, match="docs/x.md line 2: a python block may not hold a line 'PY'"):
        rb.scenarios(rb.blocks("<!-- readme: run a -->\n```python\nPY\n```\n", "docs/x.md"))


# ---- "Running your own job": the YAML example with all its stages, inspect, report, training -------------------


def _own_job_inputs(cwd: Path) -> dict[str, object]:
    """What the README's job.yaml reads: data/*.jsonl.gz, sft/*.jsonl, old/documents/*.parquet, bench/*.jsonl.gz;
    with duplicates, near duplicates, PII and a benchmark item for the stages to find."""
    rng = random.Random(7)
    docs = [_doc(rng, rng.randint(6, 14)) for _ in range(400)]
    item = {"id": "q1", "question": "A train leaves the harbor at noon carrying forty two crates of green apples "
            "and travels north along the valley river for three hours",
            "answer": "It arrives at three in the afternoon"}
    records = [{"id": f"d{i}", "text": t} for i, t in enumerate(docs)]
    records += [{"id": "dup", "text": docs[3]}, {"id": "near", "text": docs[5] + " and the river"}]
    records += [{"id": "pii", "text": _doc(rng, 8) + " Write to jane.doe@example.com or call 212-555-0199."}]
    records += [{"id": "leak", "text": _doc(rng, 8) + " " + item["question"] + " " + item["answer"] + "."}]
    (cwd / "data").mkdir()
    with gzip.open(cwd / "data" / "web.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    (cwd / "sft").mkdir()
    (cwd / "sft" / "chat.jsonl").write_text("".join(
        json.dumps({"instruction": _doc(rng, 2), "input": "", "output": _doc(rng, 4)}) + "\n" for _ in range(30)))
    (cwd / "old" / "documents").mkdir(parents=True)
    old = [_doc(rng, 8) for _ in range(40)]
    pq.write_table(pa.table({"id": [f"old{i}" for i in range(40)], "text": old,
                             "meta": [json.dumps({"source": "old", "n": i}) for i in range(40)]}),
                   cwd / "old" / "documents" / "part-000000.parquet")
    (cwd / "bench").mkdir()
    with gzip.open(cwd / "bench" / "arith.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"benchmark": "arith", **item}) + "\n")
    return {"records": len(records), "sft": 30, "old": 40}


@pytest.mark.slow
@pytest.mark.ray
def test_running_your_own_job_as_written(tmp_path):
    scenario = rb.scenarios()["own-job"]
    assert "job.yaml" in scenario.files
    _own_job_inputs(tmp_path)
    result = _run(scenario, tmp_path, timeout=900)
    out = tmp_path / "out" / "my-corpus"
    manifest = json.loads((out / "manifest.json").read_text())
    stats = json.loads((out / "stats.json").read_text())
    dropped = {reason for s in stats["stages"] for reason in s.get("dropped", {})}
    assert "exact_duplicate" in dropped and "decontaminate:arith" in dropped, dropped
    pii = next(s for s in stats["stages"] if s["stage"].endswith("-pii"))
    assert pii["counters"].get("entity:EMAIL_ADDRESS") == 1, pii
    assert manifest["shards"] and "shard set" in result.stdout            # inspect
    assert "lid" in result.stdout                                          # report: the annotating filter
    assert "arith" in result.stdout                                        # contamination-report
    assert list((tmp_path / "runs" / "tiny").rglob("*.jsonl"))            # training metrics
    assert "Chinchilla" in result.stdout or "tokens" in result.stdout     # plan
    mixture = json.loads((tmp_path / "mixture.json").read_text())         # tokenmill mix
    assert [m["name"] for m in mixture["sources"]] == ["web", "again"]
    assert (tmp_path / "out" / "blend" / "manifest.json").exists()         # --materialize
    _check_card(out, stats)                                                # tokenmill card


def _check_card(out: Path, stats: dict) -> None:
    """The card of a job with lid, gopher_quality, pii and decontaminate: the output's README.md, which the Hub's
    loader reads, its languages the kept documents' (not every one lid saw), no path of the machine in it or in
    its spec, and every figure it names there and a valid SVG / PNG."""
    import re
    import xml.etree.ElementTree as ET

    from huggingface_hub import DatasetCard
    from PIL import Image

    card = DatasetCard.load(out / "README.md")
    kept = sorted(code for code, row in stats["profile"]["languages"].items() if row["docs"])
    assert card.data.language == kept and kept
    for text in (card.content, (out / "card" / "spec.yaml").read_text()):
        assert str(out.parents[1]) not in text
    assert card.data.configs[0]["data_files"][0]["path"] == "documents/*.parquet"
    assert card.data.tokenmill["spec_hash"] == json.loads((out / "manifest.json").read_text())["spec_hash"]
    for section in ("## PII", "| EMAIL_ADDRESS | 1 | placeholder |", "## Benchmark contamination", "| arith | 1 |",
                    "gopher_quality", "## Tokenizer", "bytes / token"):
        assert section in card.text, section
    figures = re.findall(r"\]\((card/[a-z]+\.(?:svg|png))\)", card.text)
    assert {f"card/{n}.svg" for n in ("funnel", "drops", "languages", "sources", "lengths")} <= set(figures)
    for name in figures:
        if name.endswith(".svg"):
            assert ET.parse(out / name).getroot().tag == "{http://www.w3.org/2000/svg}svg"
        else:
            with Image.open(out / name) as img:
                img.verify()
                assert img.format == "PNG"


# ---- "The control plane": key, serve, submit, cancel and retry a running job, then `tokenmill submit --follow` --


@pytest.mark.slow
@pytest.mark.ray
def test_the_control_plane_commands_as_written(tmp_path):
    scenario = rb.scenarios()["control-plane"]
    rng = random.Random(3)
    raw = tmp_path / "data" / "raw"
    raw.mkdir(parents=True)
    for name in ("a", "b"):
        (raw / f"{name}.jsonl").write_text("".join(
            json.dumps({"id": f"{name}{i}", "text": _doc(rng, 12)}) + "\n" for i in range(1500)))
    result = _run(scenario, tmp_path, timeout=900)
    out = result.stdout
    ready = json.loads(out.splitlines()[0])                              # readyz, waited for
    assert ready["status"] == "ready", ready
    answers = [json.loads(line) for line in out.splitlines() if line.startswith('{"id"')]
    assert [a["state"] for a in answers[:2]] == ["CANCELLING", "QUEUED"], answers  # cancel, then retry
    detail = next(a for a in answers[2:] if "attempts" in a)
    assert detail["state"] == "SUCCEEDED" and len(detail["attempts"]) == 2, detail
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    shards = tmp_path / "data" / "shards" / "web"
    assert manifest == json.loads((shards / "manifest.json").read_text())
    assert (tmp_path / "data" / "shards" / "cli" / "manifest.json").exists()   # submit with ../ paths
    assert "SUCCEEDED" in out
    keys = [line.split() for line in out.splitlines() if line.split()[-1:] in (["me"], ["ops"], ["loader"])]
    roles = {k[-1]: (k[-3], k[-2]) for k in keys}                                  # apikey list: role, team
    assert roles == {"me": ("member", "default"), "ops": ("admin", "default"), "loader": ("reader", "vision")}, keys
    audit = [line for line in out.splitlines() if "  POST /v1/jobs" in line]        # tokenmill audit
    assert any(" ok " in line and "(me, member of default)" in line for line in audit), audit
    assert any("/cancel" in line for line in audit) and any("/retry" in line for line in audit), audit


# ---- docs/library.md and docs/writing-a-stage.md: tokenmill.apply, tokenmill.run, a stage of one's own ---------


def test_the_library_pages_as_written(tmp_path):
    result = _run(rb.scenarios()["library"], tmp_path, timeout=300)
    assert "no_lorem:placeholder" in result.stdout and "'too_short': 1" in result.stdout, result.stdout[-3000:]
