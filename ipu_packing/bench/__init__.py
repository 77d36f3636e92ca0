"""Benchmarks: ``python -m ipu_packing.bench ...`` (ipu-packing-bench) and the commands beside it.

Modules, none importing another in a circle, each bench's report beside its run: inputs (model sizes, length
histograms, a split's first-epoch packs, the options each mode takes, BenchError), harness (the one timing
harness: warm-up, order, repeats, the report's rows), throughput (the synthetic mode: plan, layouts, every
attention given, FLOPs, its table and plot), config_bench and config_finetune (--config: a training
config's own runner, data and batch accounting), peers (--peers: ours against transformers' BertForPreTraining
on the same sequences; the transformers batches both peer benches build), classify_peers (--classifier: serving
and fine-tuning steps against BertForSequenceClassification), cli (the command, which `-m` runs); and the
commands of their own: planner (every packing algorithm on one histogram), prepare_scale and pack_existing (the
data commands at scale), convergence (fine-tuning packed and padded over seeds), gpu_check with run_compare
(``make gpu-check``: the prepared command for a lent GPU, a kill at a known step, bitwise comparison of runs).
"""
