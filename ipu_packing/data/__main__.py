"""python -m ipu_packing.data prepare|pack|inspect ...

The command is behind the ``__main__`` guard, as in every entry point: a module imported again as
``__mp_main__`` by a forkserver or spawn child must not run it (multiprocessing itself leaves a package's
__main__.py alone, but runpy or an import may not). docs/execution.md, "The loader's processes"."""

import sys

if __name__ == "__main__":
    from ipu_packing.data.cli import main

    sys.exit(main())
