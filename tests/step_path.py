"""The modules one training step goes through, counted: ``python tests/step_path.py``.

Runs ``run_pretraining.py``'s ``main`` in this process for one optimizer step of a tiny BERT on a small prepared
dataset (app_fixtures.write_prepared), with a checkpoint and the export (load -> one step -> checkpoint ->
export), and lists every module of the package a function of which was called (module bodies, i.e. imports,
left out), in the order first entered, with its line count. docs/architecture.md quotes the totals.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from typing import List, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def step_path() -> List[Tuple[str, int]]:
    sys.path[:0] = [REPO, os.path.join(REPO, "tests")]
    from app_fixtures import write_prepared

    root = tempfile.mkdtemp()
    data = write_prepared(os.path.join(root, "data"))
    argv = ["--config", "demo", "data.dir=" + data, "data.max_seq_length=32", "model.vocab_size=64",
            "model.hidden_size=16", "model.num_attention_heads=2", "model.intermediate_size=32",
            "execution.micro_batch_size=4", "training.global_batch_sequences=8", "training.steps=1",
            "checkpoint.output_dir=" + os.path.join(root, "run"), "logging.progress_bar=false",
            "logging.tensorboard=false"]
    package = os.path.join(REPO, "ipu_packing")
    seen = {}  # type: dict

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(package) and code.co_name != "<module>":
            seen.setdefault(code.co_filename, None)

    from ipu_packing.train.cli import main

    sys.setprofile(profile)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    finally:
        sys.setprofile(None)
    assert code == 0, code
    out = []
    for path in seen:
        with open(path, encoding="utf-8") as f:
            out.append((os.path.relpath(path, REPO), sum(1 for _ in f)))
    return out


if __name__ == "__main__":
    modules = step_path()
    for path, lines in modules:
        print("%5d  %s" % (lines, path))
    print("modules: %d, lines: %d" % (len(modules), sum(n for _, n in modules)))
