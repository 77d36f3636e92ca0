"""python -m ipu_packing.execution dry-run --config NAME|PATH [section.key=value ...]

The command is behind the ``__main__`` guard, as in every entry point (docs/execution.md, "The loader's
processes")."""

import sys

if __name__ == "__main__":
    from ipu_packing.execution.cli import main

    sys.exit(main())
