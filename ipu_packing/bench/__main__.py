"""python -m ipu_packing.bench ...

The command is behind the ``__main__`` guard, as in every entry point (data/__main__.py says why)."""

import sys

if __name__ == "__main__":
    from ipu_packing.bench.cli import main

    sys.exit(main())
