"""BERT phase-2 pretraining on packed sequences: `python run_pretraining.py --config demo [key=value ...]`.

Thin entry point; everything lives in ipu_packing.train (see docs/app.md).

Everything, imports included, stays behind the ``__main__`` guard: PopTorch's asynchronous DataLoader starts
its worker with forkserver (or spawn), and that child imports this file again, as ``__mp_main__``, before it
unpickles the dataset. Unguarded, the child would run the whole command again (docs/execution.md).
"""

import sys

if __name__ == "__main__":
    from ipu_packing.train.cli import main

    sys.exit(main())
