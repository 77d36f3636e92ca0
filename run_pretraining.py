"""BERT phase-2 pretraining on packed sequences: `python run_pretraining.py --config demo [key=value ...]`.

Thin entry point; everything lives in ipu_packing.train (see docs/app.md).
"""

import sys

from ipu_packing.train.cli import main

sys.exit(main())
