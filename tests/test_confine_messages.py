"""Issue 37: a 403 for a path outside the roots names the field, the roots it must lie in and the path as the
spec wrote it, and nothing found beyond the roots (no file a glob matched through a symlink, no link target)."""

from __future__ import annotations

from tests.test_service_api import _spec, _submit, api  # noqa: F401 - a fixture (SQLite and PostgreSQL)
from tests.test_service_store import postgres_url  # noqa: F401 - a fixture

#: names only the folder outside the roots holds: none may appear in an answer that did not write them
HIDDEN = ("beyond-the-roots", "hidden-name")


def test_a_403_names_the_field_the_roots_and_the_path_as_written_and_nothing_beyond(api, tmp_path):  # noqa: F811
    client, headers, root = api
    outside = tmp_path / HIDDEN[0]
    outside.mkdir()
    for name in (f"{HIDDEN[1]}.jsonl", f"{HIDDEN[1]}-2.jsonl"):
        (outside / name).write_text('{"text": "secret"}\n')
    (root / "in" / "link").symlink_to(outside)  # a folder inside the root that leads out of it
    (root / "out_link").symlink_to(outside)
    cases = [(("inputs", 0, "path"), {"inputs": [{"path": str(root / "in" / "*" / "*.jsonl")}]}),  # matches via link
             (("inputs", 0, "path"), {"inputs": [{"path": str(root / "in")}]}),  # the folder holds the link
             (("inputs", 0, "path"), {"inputs": [{"path": str(root / "in" / "link" / "*.jsonl")}]}),
             (("inputs", 0, "path"), {"inputs": [{"path": str(root / "in" / "link" / f"{HIDDEN[1]}.jsonl")}]}),
             (("output", "path"), {"output": {"path": str(root / "out_link" / "o")}}),
             (("stages", 0, "params", "dedup_against"),
              {"stages": [{"type": "exact_dedup", "params": {"dedup_against": str(root / "in" / "link")}}]})]
    for loc, over in cases:
        r = _submit(client, headers, _spec(root) | over)
        assert r.status_code == 403, (over, r.text)
        [problem] = r.json()["detail"]  # one problem for the field, however many files the glob matched
        assert problem["loc"] == ["body", *loc] and problem["type"] == "path_not_allowed", problem
        written = over["inputs"][0]["path"] if "inputs" in over else over.get("output", {}).get("path") or \
            over["stages"][0]["params"]["dedup_against"]
        assert repr(written) in problem["msg"] and f"({root})" in problem["msg"], problem
        assert not any(h in problem["msg"].replace(repr(written), "") for h in HIDDEN), problem
