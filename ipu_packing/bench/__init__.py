"""Benchmarks of packed against padded pretraining: ``python -m ipu_packing.bench ...`` (ipu-packing-bench).

Modules, each importing only those before it (no circles): inputs (length histograms, BenchError), report
(the result, its table and plot), throughput (the synthetic mode: plan, layouts, interleaved timing through
the training runner), config_bench (--config: a training config's own runner, data and batch accounting),
attention (--attention varlen: the four layout x attention pairs), peer_batches (what each contender of
--peers is fed) and peers (--peers: ours against transformers' BertForPreTraining on the same sequences), cli
(the command, which `-m` runs), run_compare (training commands, a kill at a known step, bitwise comparison of
two runs) and gpu_check (``make gpu-check``: the prepared command for a lent GPU).
"""
