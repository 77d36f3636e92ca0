"""python -m ipu_packing.packing --histogram FILE ...

The command is behind the ``__main__`` guard, as in every entry point (docs/execution.md, "The loader's
processes")."""

import sys

if __name__ == "__main__":
    from ipu_packing.packing.cli import main

    sys.exit(main())
