"""The evaluation's JSON (``{"model", "tasks": {NAME: {...}}}``) and the same as one Markdown table."""

from __future__ import annotations

from typing import Any

#: the mark of a task some of whose items the job found in its data
FLAG = "⚠"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _value(entry: dict[str, Any]) -> str:
    text = _number(entry.get("value"))
    if entry.get("acc_norm") is not None:
        text += f" (norm {_number(entry['acc_norm'])})"
    return text


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|")


def markdown(report: dict[str, Any]) -> str:
    """One row per task: its metric over all items and, with a job, over the clean ones; a task with found
    items is flagged."""
    tasks: dict[str, dict[str, Any]] = report["tasks"]
    with_job = any("found" in t for t in tasks.values())
    head = ["task", "metric", "all", "items"] + (["clean", "clean items", "found"] if with_job else [])
    rows = []
    for name, t in tasks.items():
        row = [name + (f" {FLAG}" if t.get("found") else ""), t["metric"], _value(t), t["items"]]
        if with_job:
            clean = t.get("clean")
            row += [_value(clean), clean["items"], t["found"]] if clean is not None else ["-", "-", "-"]
        rows.append("| " + " | ".join(_cell(c) for c in row) + " |")
    lines = [f"Model: {_cell(report['model'])}", "", "| " + " | ".join(head) + " |",
             "|" + "|".join(["---"] * len(head)) + "|", *rows]
    if with_job and any(t.get("found") for t in tasks.values()):
        lines += ["", f"{FLAG}: the job found some of this benchmark's items in its data; \"clean\" leaves them out."]
    return "\n".join(lines) + "\n"
