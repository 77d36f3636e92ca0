"""Benchmarks of packed against padded pretraining (``python -m ipu_packing.bench ...``)."""
