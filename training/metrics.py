"""Training metrics: JSON lines (the record), TensorBoard (the view), MFU only against a known peak.

MFU is achieved model FLOPs over the device's dense bf16 peak. An unknown device gets no MFU rather
than a wrong one; ``log.peak_flops`` supplies the peak for a device not in the table.
"""

from __future__ import annotations

import json
import math
import resource
import sys
from pathlib import Path
from typing import Any

import torch

#: dense (no sparsity) bf16 tensor-core peaks, FLOP/s per device, from the vendors' data sheets
PEAK_BF16_FLOPS: dict[str, float] = {
    "H200": 989e12,
    "H100": 989e12,
    "H800": 989e12,
    "GH200": 989e12,
    "B200": 2250e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
}


def device_peak_flops(device: torch.device, override: float | None = None) -> float | None:
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).upper()
    # longest names first so "GH200" is not read as "H200" and "H100" not as "A100"
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if key in name.replace(" ", ""):
            if key == "H100" and "PCIE" in name:
                return 756e12  # H100 PCIe's dense bf16 peak is lower than SXM's
            if key in ("H100", "H200") and "NVL" in name:
                return 835e12  # the NVL (PCIe card) parts run at lower clocks than SXM
            return PEAK_BF16_FLOPS[key]
    return None


def memory_stats(device: torch.device) -> dict[str, float]:
    if device.type == "cuda":
        return {"mem_alloc_gb": torch.cuda.max_memory_allocated(device) / 2**30,
                "mem_reserved_gb": torch.cuda.max_memory_reserved(device) / 2**30}
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"max_rss_gb": rss_kb / 2**20}


class MetricsLogger:
    """Rank 0 writes ``metrics.jsonl`` and TensorBoard events under ``out_dir``; other ranks no-op."""

    def __init__(self, out_dir: str | Path, enabled: bool, tensorboard: bool = True) -> None:
        self.enabled = enabled
        self.path = Path(out_dir) / "metrics.jsonl"
        self._tb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", buffering=1)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter  # optional: tensorboard may be missing
            except ImportError:
                print("tokenmill train: tensorboard is not installed; writing metrics.jsonl only "
                      "(pip install 'tokenmill[train]')", file=sys.stderr)
            else:
                self._tb = SummaryWriter(str(Path(out_dir) / "tb"))

    def log(self, step: int, values: dict[str, Any], group: str = "train") -> None:
        """One JSON line (and TensorBoard scalars under ``group/``, e.g. ``eval/val_loss``)."""
        if not self.enabled:
            return
        record = {"step": step, **{k: v for k, v in values.items() if v is not None}}
        self._file.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, int | float) and math.isfinite(v):
                    self._tb.add_scalar(f"{group}/{k}", v, step)
        shown = " ".join(f"{k}={_fmt(v)}" for k, v in record.items())
        print(shown, flush=True)

    def close(self) -> None:
        if not self.enabled:
            return
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"
    return str(v)
