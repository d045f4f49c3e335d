"""One output against another (``tokenmill card OUT --compare OTHER``; a schedule's version against the one
before): documents, tokens, languages and drop reasons side by side."""

from __future__ import annotations

from pipeline.card.collect import CardData
from pipeline.card.markdown import escape, table


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1] or path


def compare_section(this: CardData, other: CardData, other_path: str) -> str:
    """A Markdown section: every figure of ``other`` (before) and ``this`` (now) with the change."""
    def row(what: str, before: int, now: int) -> list[object]:
        return [what, before, now, f"{now - before:+,}"]

    rows = [row("documents kept", other.kept_docs, this.kept_docs),
            row("tokens", int((other.stats.get("output") or {}).get("tokens", 0)),
                int((this.stats.get("output") or {}).get("tokens", 0)))]
    for code in sorted(set(this.languages) | set(other.languages)):
        rows.append(row(f"language {code} (lid)", other.languages.get(code, 0), this.languages.get(code, 0)))
    a, b = other.drop_reasons(), this.drop_reasons()
    for reason in sorted(set(a) | set(b)):
        rows.append(row(f"dropped {reason}", a.get(reason, 0), b.get(reason, 0)))
    name = _name(other_path)
    return "\n".join([f"## Compared with {escape(name)}", "", f"{escape(name)} ({escape(other.name)}) before, this "
                      "output now:", "",
                      table(["", name, "this", "change"], rows)])


def history_rows(history: list[tuple[str, CardData]], this: CardData, this_name: str) -> list[tuple[str, int, int]]:
    """(name, documents, tokens) of every earlier output, then this one: the versions figure."""
    def tokens(d: CardData) -> int:
        return int((d.stats.get("output") or {}).get("tokens", 0))
    return [(_name(p), d.kept_docs, tokens(d)) for p, d in history] + [(this_name, this.kept_docs, tokens(this))]
