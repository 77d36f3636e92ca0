"""BERT fine-tuning on packed sequences: `python run_finetuning.py --config finetune_demo [key=value ...]`.

Thin entry point; everything lives in ipu_packing.train (docs/finetuning.md). The same run machinery as
run_pretraining.py (checkpoints, bitwise resume, stopping at a step, finished runs, metrics), with a task's head
and its evaluation.

Everything, imports included, stays behind the ``__main__`` guard: PopTorch's asynchronous DataLoader starts
its worker with forkserver (or spawn), and that child imports this file again, as ``__mp_main__``, before it
unpickles the dataset. Unguarded, the child would run the whole command again (docs/execution.md).
"""

import sys

if __name__ == "__main__":
    from ipu_packing.train.cli import finetune_main

    sys.exit(finetune_main())
