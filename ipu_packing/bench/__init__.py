"""Benchmarks of packed against padded pretraining: ``python -m ipu_packing.bench ...`` (ipu-packing-bench).

Modules, each importing only those before it (no circles): inputs (length histograms, BenchError), report
(the result, its table and plot), throughput (the synthetic mode: plan, layouts, interleaved timing through
the training runner), config_bench (--config: a training config's own runner, data and batch accounting),
attention (--attention varlen: the four layout x attention pairs), cli (the command, which `-m` runs).
"""
