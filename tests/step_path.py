"""The modules one training step goes through, counted: ``python tests/step_path.py [TASK]``.

Runs the training entry's ``main`` in this process for one optimizer step of a tiny BERT on a small prepared
dataset (load -> one step -> checkpoint -> export; a fine-tuning task also evaluates, at its last step), and lists
every module of the package a function of which was called (module bodies, i.e. imports, left out), in the order
first entered, with its line count. TASK: pretraining (default: app_fixtures.write_prepared, run_pretraining.py),
classification or question_answering (the embedded demo task, run_finetuning.py, fresh weights).
docs/architecture.md quotes the totals.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from typing import Callable, List, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


TINY = ["model.vocab_size=8192", "model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=2",
        "model.num_attention_heads=2", "data.max_seq_length=64", "execution.micro_batch_size=4",
        "training.steps=1", "logging.progress_bar=false", "logging.tensorboard=false", "checkpoint.init_from=null"]
"""A fine-tuning step's tiny model and batch."""


def command(task: str = "pretraining") -> Tuple[List[str], Callable[[List[str]], int]]:
    """(argv, the entry's main) of one step of TASK on freshly prepared data in a temporary directory."""
    sys.path[:0] = [REPO, os.path.join(REPO, "tests")]
    import app_fixtures as fx

    root = tempfile.mkdtemp()
    run = ["checkpoint.output_dir=" + os.path.join(root, "run")]
    if task == "pretraining":
        data = fx.write_prepared(os.path.join(root, "data"))
        argv = ["--config", "demo", "data.dir=" + data, "data.max_seq_length=32", "model.vocab_size=64",
                "model.hidden_size=16", "model.num_attention_heads=2", "model.intermediate_size=32",
                "execution.micro_batch_size=4", "training.global_batch_sequences=8", "training.steps=1",
                "logging.progress_bar=false", "logging.tensorboard=false"] + run
    elif task == "classification":
        data = fx.prepare_demo_task(os.path.join(root, "data"))
        argv = ["--config", "finetune_demo", "data.dir=" + data, "data.max_sequences_per_pack=6",
                "training.global_batch_sequences=24"] + TINY + run
    else:
        data = fx.prepare_qa_demo_task(os.path.join(root, "data"))
        argv = ["--config", "finetune_qa_demo", "data.dir=" + data, "data.max_sequences_per_pack=4",
                "training.global_batch_sequences=8"] + TINY + run
    from ipu_packing.train.cli import finetune_main, main

    return argv, (main if task == "pretraining" else finetune_main)


def step_path(task: str = "pretraining") -> List[Tuple[str, int]]:
    argv, entry = command(task)
    package = os.path.join(REPO, "ipu_packing")
    seen = {}  # type: dict

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(package) and code.co_name != "<module>":
            seen.setdefault(code.co_filename, None)

    sys.setprofile(profile)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            code = entry(argv)
    finally:
        sys.setprofile(None)
    assert code == 0, code
    out = []
    for path in seen:
        with open(path, encoding="utf-8") as f:
            out.append((os.path.relpath(path, REPO), sum(1 for _ in f)))
    return out


if __name__ == "__main__":
    modules = step_path(*sys.argv[1:2])
    for path, lines in modules:
        print("%5d  %s" % (lines, path))
    print("modules: %d, lines: %d" % (len(modules), sum(n for _, n in modules)))
