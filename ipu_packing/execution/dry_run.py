"""Dry run: what a config would place where, how much weight memory each IPU/stage needs, and the batch
sizes in packs and in sequences. Arithmetic only: needs neither poptorch nor a model instance.

Parameter counts follow transformers' BertForPreTraining exactly (tests check the total against it); the
MLM decoder weight is tied to the word embedding and counted once, with the embeddings. Memory counted:

- weights, at the precision the model runs in (fp16: 2 bytes, else 4; bf16 autocast keeps fp32 weights);
- gradient accumulators, one per weight at the same precision (poptorch keeps them only when accumulating
  gradients over micro batches; torch always holds ``.grad``);
- optimizer state in fp32: 2 tensors per weight for LAMB/AdamW/Adam (first and second moments), 1 for SGD;
  on chip unless ``optimizer_state_offchip`` (the default, as in the published IPU BERT app) moves it to
  streaming memory, and divided by the replication factor under replicated tensor sharding.

Not counted: activations, pipeline stashes, code and exchange buffers, which need whatever is left of the
900 MB.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from .config import IPU_MEMORY_BYTES, ExecutionConfig
from .placement import Placement, plan_placement

OPTIMIZER_STATES = {"lamb": 2, "adamw": 2, "adam": 2, "sgd": 1}


def module_parameters(model_config) -> Dict[str, int]:
    """Parameter count of every placed module (BertForPreTraining layout, tied decoder counted once)."""
    H, I, V = model_config.hidden_size, model_config.intermediate_size, model_config.vocab_size
    P, T = model_config.max_position_embeddings, model_config.type_vocab_size
    counts = {"bert.embeddings": (V + P + T) * H + 2 * H}
    per_layer = 4 * (H * H + H) + 2 * H + (H * I + I) + (I * H + H) + 2 * H  # attention, LN, FFN, LN
    for i in range(model_config.num_hidden_layers):
        counts["bert.encoder.layer.%d" % i] = per_layer
    counts["bert.pooler"] = H * H + H
    # MLM transform (dense + LayerNorm) + decoder bias (its weight is the word embedding) + NSP classifier
    counts["cls"] = (H * H + H) + 2 * H + V + (2 * H + 2)
    return counts


def _fmt_bytes(n: float) -> str:
    return "%.1f MB" % (n / 1e6)


def _fmt_count(n: float) -> str:
    return "%.2fM" % (n / 1e6) if n >= 1e5 else "%d" % n


def memory_per_device(
    model_config, execution: ExecutionConfig, optimizer: str = "lamb"
) -> Tuple[List[Placement], List[Dict[str, float]]]:
    """(placement, one dict per IPU/stage: params, weights, gradients, optimizer, total bytes)."""
    optimizer = optimizer.lower()
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError("optimizer must be one of %s, got %r" % (sorted(OPTIMIZER_STATES), optimizer))
    plan = plan_placement(model_config.num_hidden_layers, execution)
    counts = module_parameters(model_config)
    ipu = execution.backend == "poptorch"
    where = [(p.ipu if ipu else p.stage) for p in plan]
    params = [0] * execution.num_stages
    for p, d in zip(plan, where):
        params[d] += counts[p.module]
    if not ipu and execution.num_stages > 1:
        # torch pipeline: the heads' stage holds its own copy of the tied word embedding
        params[execution.num_stages - 1] += model_config.vocab_size * model_config.hidden_size
    weight_bytes = 2 if (ipu and execution.precision == "fp16") else 4  # torch autocast keeps fp32 weights
    keeps_grads = (not ipu) or execution.gradient_accumulation > 1
    offchip = ipu and execution.optimizer_state_offchip
    shards = execution.replication_factor if (ipu and execution.replicated_tensor_sharding) else 1
    rows = []
    for n in params:
        state = float(n * 4 * OPTIMIZER_STATES[optimizer]) / shards
        row = {
            "params": float(n),
            "weights": float(n * weight_bytes),
            "gradients": float(n * weight_bytes if keeps_grads else 0),
            "optimizer": 0.0 if offchip else state,
            "optimizer_offchip": state if offchip else 0.0,
        }
        row["total"] = row["weights"] + row["gradients"] + row["optimizer"]
        rows.append(row)
    return plan, rows


def dry_run_report(
    model_config, execution: ExecutionConfig, sequences_per_pack: float = 1.0, optimizer: str = "lamb"
) -> str:
    """The placement of every layer, weight/optimizer memory per IPU (vs 900 MB) and the batch sizes."""
    if not sequences_per_pack >= 1.0:
        raise ValueError("sequences per pack must be >= 1, got %r" % (sequences_per_pack,))
    plan, rows = memory_per_device(model_config, execution, optimizer)
    counts = module_parameters(model_config)
    ipu = execution.backend == "poptorch"
    e = execution
    lines = []
    if ipu:
        lines.append(
            "Dry run: poptorch, %d IPU(s) per replica x %d replica(s) = %d IPUs requested (rounded to %d), %s"
            % (e.ipus_per_replica, e.replication_factor, e.ipus_per_replica * e.replication_factor, e.total_ipus,
               e.precision)
        )
    else:
        lines.append(
            "Dry run: torch on %s, %d replica(s) x %d pipeline stage(s) = %d process(es), %s"
            % (e.device, e.replication_factor, e.num_stages, e.world_size, e.precision)
        )
    lines.append(
        "Model: %d layers, hidden %d, intermediate %d, heads %d, vocab %d, %s parameters"
        % (model_config.num_hidden_layers, model_config.hidden_size, model_config.intermediate_size,
           model_config.num_attention_heads, model_config.vocab_size, _fmt_count(sum(counts.values())))
    )
    lines.append("")
    unit = "IPU" if ipu else "stage"
    lines.append(
        "Placement (%s)" % ("poptorch BeginBlock per module" if ipu else "torch.distributed.pipelining stage = process")
    )
    lines.append("  %-24s %-11s %5s %10s %11s" % ("module", "block", unit, "recompute", "params"))
    for p in plan:
        note = "  (+ MLM decoder tied to word embeddings)" if p.module == "cls" else ""
        lines.append(
            "  %-24s %-11s %5d %10s %11s%s"
            % (p.module, p.block, p.ipu if ipu else p.stage, "yes" if p.recompute and ipu else "no",
               _fmt_count(counts[p.module]), note)
        )
    lines.append("")
    lines.append(
        "Memory per %s: weights (%s), %s, %s optimizer state (fp32%s); activations, stashes and code not counted"
        % (unit, "fp16" if (ipu and e.precision == "fp16") else "fp32", "gradient accumulators" if ipu else "gradients",
           optimizer.lower(), ", off chip" if ipu and e.optimizer_state_offchip else "")
    )
    if ipu:
        lines.append("  %-5s %9s %10s %10s %10s %10s %9s %12s" % (unit, "params", "weights", "grads", "optimizer",
                                                                   "on chip", "of 900MB", "off chip"))
    else:
        lines.append("  %-5s %9s %10s %10s %10s %10s" % (unit, "params", "weights", "grads", "optimizer", "total"))
    for d, r in enumerate(rows):
        cells = (d, _fmt_count(r["params"]), _fmt_bytes(r["weights"]), _fmt_bytes(r["gradients"]),
                 _fmt_bytes(r["optimizer"]), _fmt_bytes(r["total"]))
        if not ipu:
            lines.append("  %-5d %9s %10s %10s %10s %10s" % cells)
            continue
        share = r["total"] / IPU_MEMORY_BYTES
        flag = "  EXCEEDS the IPU's memory" if share > 1 else ""
        lines.append("  %-5d %9s %10s %10s %10s %10s %8.1f%% %12s%s"
                     % (cells + (100 * share, _fmt_bytes(r["optimizer_offchip"]), flag)))
        amp = e.memory_proportion_for(d) if ipu else None
        if amp is not None:
            lines[-1] += "  (availableMemoryProportion %.2f)" % amp
    if not ipu and e.num_stages > 1 and e.replication_factor > 1:
        lines.append("  note: backend torch runs DDP replication or a pipeline, not both: make_runner refuses this config")
    if not ipu and e.num_stages > 1:
        lines.append("  (the last stage holds a copy of the tied word embedding; their gradients are summed each step)")
    lines.append("")
    spp = float(sequences_per_pack)
    lines.append("Batch (packs; sequences at %.3f sequences per pack)" % spp)
    rows_b = [
        ("micro batch (per replica)", e.micro_batch_size),
        ("per replica per optimizer step (x %d accumulation)" % e.gradient_accumulation, e.packs_per_replica_step),
        ("global batch per optimizer step (x %d replicas)" % e.replication_factor, e.global_batch_packs),
    ]
    if ipu:
        rows_b.append(("per host call = DataLoader item (x %d device iterations)" % e.device_iterations,
                       e.combined_batch_packs))
    for name, packs in rows_b:
        lines.append("  %-58s %8d packs  %10.1f sequences" % (name, packs, packs * spp))
    return "\n".join(lines) + "\n"
