"""python -m ipu_packing.execution dry-run --config NAME|PATH [section.key=value ...]

The command reads a training config, so it lives with the config loader (ipu_packing/train/cli.py); an entry
point sits above every floor. It is behind the ``__main__`` guard, as in every entry point (docs/execution.md,
"The loader's processes")."""

import sys

if __name__ == "__main__":
    from ipu_packing.train.cli import execution_main

    sys.exit(execution_main())
