"""ipu-packing: BERT phase-2 pretraining on packed sequences (Krell et al., arXiv 2107.02027).

Data flows one way: histogram -> plan -> packs -> batches -> model -> metrics.
Everything importable on the IPU path must run on Python 3.8, torch 2.0.1 and transformers 4.x.
"""

__version__ = "0.1.0"
