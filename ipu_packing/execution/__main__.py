"""python -m ipu_packing.execution dry-run --config NAME|PATH [section.key=value ...]"""

import sys

from ipu_packing.execution.cli import main

sys.exit(main())
