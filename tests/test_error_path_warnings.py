"""One line means one line: a refused file is reported without a third-party warning above the error.

torch.load(weights_only=True) refuses a crafted pickle, but first warns about its pickle protocol
("UserWarning: Detected pickle protocol ..."): two more lines on stderr above the `error:` line, as the
training command printed them for a crafted `checkpoint.init_from` before model/checkpoint.load_tensors."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Payload:
    def __reduce__(self):
        return (print, ("the pickle ran code",))


def test_a_crafted_checkpoint_as_init_from_is_one_stderr_line(default_data_128, tmp_path):
    evil = tmp_path / "evil.pt"
    with open(str(evil), "wb") as f:
        pickle.dump({"step": 1, "model": {}, "payload": _Payload()}, f, protocol=4)
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "run_pretraining.py"), "--config", "demo",
         "data.dir=%s" % os.path.dirname(default_data_128), "checkpoint.init_from=%s" % evil,
         "checkpoint.output_dir=%s" % (tmp_path / "run"), "training.steps=1", "logging.progress_bar=false"],
        capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT, PYTHONWARNINGS="default"))
    assert result.returncode == 2 and "the pickle ran code" not in result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: checkpoint %s is unreadable" % evil), result.stderr
