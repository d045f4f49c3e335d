"""Stages used only by tests: importable by Ray workers (the repo root is on their path) as tests.stage_probes."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from pipeline.documents import Doc, Drop
from pipeline.stages.base import Stage, StageParams

#: what PrepareProbe.prepare returns: the workers must see exactly this
PREPARED = {"token": "tok-42", "index": [3, 1, 4, 1, 5]}


class ProbeParams(StageParams):
    log_dir: str


class PrepareProbe(Stage):
    """Logs every ``prepare`` and ``setup`` call with its process id; counts documents that saw the value."""

    name = "prepare_probe"
    Params = ProbeParams

    def prepare(self) -> dict:
        with open(Path(self.params.log_dir) / "prepare.log", "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")
        return PREPARED

    def setup(self) -> None:
        with open(Path(self.params.log_dir) / "setup.log", "a", encoding="utf-8") as f:
            f.write(json.dumps({"pid": os.getpid(), "prepared": self.prepared}) + "\n")

    def process(self, docs: list[Doc]) -> Iterator[Doc | Drop]:
        for doc in docs:
            self.count("saw_prepared" if self.prepared == PREPARED else "missed_prepared")
            doc["meta"]["probe"] = (self.prepared or {}).get("token")
            yield doc
