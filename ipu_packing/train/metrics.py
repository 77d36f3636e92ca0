"""Per-step metrics: a named record, a progress bar, TensorBoard scalars and JSON lines."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, Optional


@dataclass
class StepRecord:
    """What one optimizer step reports (metrics.jsonl holds one of these per line)."""

    step: int
    loss: float
    mlm_loss: float
    nsp_loss: float
    mlm_accuracy: float
    nsp_accuracy: float
    lr: float
    sequences: int
    """Real sequences in the step (all packs of the step)."""
    tokens: int
    """Real (non-padding) tokens in the step."""
    packs: int
    """Rows of the step: packs, or padded sequences for the baseline."""
    packing_factor: float
    """sequences / packs in this step."""
    seconds: float
    """Wall time of the step."""
    sequences_per_second: float
    tokens_per_second: float
    epoch: int

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


class MetricsLogger:
    """Writes StepRecords to metrics.jsonl and TensorBoard, and drives a tqdm progress bar."""

    def __init__(self, run_dir: str, total_steps: int, start_step: int, logging_config, log=print):
        self.jsonl_path = os.path.join(run_dir, "metrics.jsonl") if logging_config.jsonl else None
        self.writer = None
        if logging_config.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(os.path.join(run_dir, "tensorboard"), purge_step=start_step + 1)
            except Exception as exc:  # tensorboard is optional (e.g. a Poplar SDK venv without it)
                log("note: TensorBoard logging off (%s)" % (type(exc).__name__,))
        self.bar = None
        if logging_config.progress_bar:
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True, file=sys.stderr)
        self._jsonl = open(self.jsonl_path, "a", encoding="utf-8") if self.jsonl_path else None

    def log(self, record: StepRecord) -> None:
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(record.to_dict(), sort_keys=True) + "\n")
            self._jsonl.flush()
        if self.writer is not None:
            for key, value in record.to_dict().items():
                if key not in ("step", "epoch"):
                    self.writer.add_scalar("train/" + key, value, record.step)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(
                loss="%.3f" % record.loss,
                mlm_acc="%.3f" % record.mlm_accuracy,
                nsp_acc="%.3f" % record.nsp_accuracy,
                seq_s="%.1f" % record.sequences_per_second,
                pf="%.2f" % record.packing_factor,
                refresh=False,
            )

    def write(self, message: str) -> None:
        if self.bar is not None:
            self.bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()
        if self._jsonl is not None:
            self._jsonl.close()
