"""python -m ipu_packing.execution dry-run --config configs/X.yaml [--sequences-per-pack F] [--optimizer lamb]"""

from ipu_packing.execution.cli import main

main()
