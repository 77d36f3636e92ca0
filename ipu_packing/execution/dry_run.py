"""Dry run: what a config would place where, how much memory each IPU/stage needs, and the batch sizes in
packs and in sequences. Arithmetic only: needs neither poptorch nor a model instance.

Parameter counts follow transformers' BertForPreTraining exactly (tests check the total against it); the
MLM decoder weight is tied to the word embedding and counted once, with the embeddings. Per IPU (poptorch)
the table has, in bytes (legend: B micro batch in packs, S sequence length, H hidden, I intermediate,
N attention heads, L_g encoder layers in a pipeline group, d_g its stash depth, b bytes per activation):

- weights, at the model's precision (fp16: 2 bytes, else 4); exact;
- gradient accumulators, one per weight at ``ExecutionConfig.accumulator_type`` (the ``accum_type`` the
  adapter gives poptorch.optim; PopTorch's own default is fp32, optim.py:733-734), only when accumulating
  over micro batches (PopART keeps none otherwise); exact;
- optimizer state: first and second moments (SGD: velocity) at their configured types, divided by the
  replicas of one instance under replicated tensor sharding (PopTorch shards over the instance's own
  replicas when there are several, popart_compiler/source/Compiler.cpp:751-760); on chip, or in streaming memory when
  ``optimizer_state_offchip``; exact;
- stream buffer (estimate): with the state off chip, the weight update brings each tensor's state on chip
  to update it; at least the largest tensor's state (its shard under sharding) is on chip at once;
- stash (estimate): see ``stash_depths`` and ``activation_bytes``;
- activations (estimate): what is live while the recomputed unit runs its backward;
- saved by Graphcore's memory choices (estimates, not in the total; ``memory_choices``): the fp16 mask's
  bytes in the stash (already counted at 2 bytes in the stash row), the fp32 (B*M, V) logits copy the fp16
  MLM loss does without, and the two (B, S, H) partial input gradients a fused QKV does without.

Not counted: code, exchange and IPU-copy buffers, matmul temporaries (bounded by availableMemoryProportion),
the heads' (B, M, V) logits, host-stream buffers. IPUs whose counted total passes 900 MB are flagged.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from .. import tasks
from .config import IPU_MEMORY_BYTES, TYPE_BYTES, ExecutionConfig
from .placement import Placement, min_gradient_accumulation, pipeline_groups, plan_placement
from .popdist_backend import describe_launch
from .poptorch_options import describe_options

OPTIMIZER_STATES = {"lamb": 2, "adamw": 2, "adam": 2, "sgd": 1}


def _fused_qkv(model_config) -> bool:
    return bool(getattr(model_config, "fused_qkv", False))  # ipu_packing/model/self_attention.py


def _placed(counts: Dict[str, int], model_config, task: str) -> Dict[str, int]:
    """``counts`` of the modules ``task``'s model places (model/stages.py), in the order it places them."""
    from ipu_packing.model.stages import task_stages

    parts = task_stages(task, model_config.num_hidden_layers).parts
    return {m: counts[m] for p in parts for m in p.modules}


def module_parameters(model_config, task: str = tasks.PRETRAINING.name) -> Dict[str, int]:
    """Parameter count of every module ``task``'s model places (transformers' layout of the same model:
    BertForPreTraining's tied decoder counted once)."""
    H, FF, V = model_config.hidden_size, model_config.intermediate_size, model_config.vocab_size
    P, T = model_config.max_position_embeddings, model_config.type_vocab_size
    counts = {"bert.embeddings": (V + P + T) * H + 2 * H}
    per_layer = 4 * (H * H + H) + 2 * H + (H * FF + FF) + (FF * H + H) + 2 * H  # attention, LN, FFN, LN
    for i in range(model_config.num_hidden_layers):
        counts["bert.encoder.layer.%d" % i] = per_layer
    counts["bert.pooler"] = H * H + H
    # MLM transform (dense + LayerNorm) + decoder bias (its weight is the word embedding) + NSP classifier
    counts["cls"] = (H * H + H) + 2 * H + V + (2 * H + 2)
    L = int(getattr(model_config, "num_labels", 2))
    counts["classifier"] = H * L + L  # a classifier's head (classification.py)
    counts["qa_outputs"] = 2 * H + 2  # question answering's
    return _placed(counts, model_config, task)


def largest_tensors(model_config, task: str = tasks.PRETRAINING.name) -> Dict[str, int]:
    """Elements of the largest parameter tensor of every placed module (the tied decoder weight counted with
    the embeddings; a fused QKV weight is one (3H, H) tensor)."""
    H, FF, V = model_config.hidden_size, model_config.intermediate_size, model_config.vocab_size
    P = model_config.max_position_embeddings
    largest = {"bert.embeddings": max(V, P, model_config.type_vocab_size) * H}
    for i in range(model_config.num_hidden_layers):
        largest["bert.encoder.layer.%d" % i] = max((3 if _fused_qkv(model_config) else 1) * H * H, H * FF)
    largest["bert.pooler"] = H * H
    largest["cls"] = max(H * H, V, 2 * H)
    largest["classifier"] = H * int(getattr(model_config, "num_labels", 2))
    largest["qa_outputs"] = 2 * H
    return _placed(largest, model_config, task)


def _fmt_bytes(n: float) -> str:
    return "%.1f MB" % (n / 1e6)


def _fmt_count(n: float) -> str:
    return "%.2fM" % (n / 1e6) if n >= 1e5 else "%d" % n


def stash_depths(num_groups: int) -> List[int]:
    """Micro batches in flight, hence stash entries, for a tensor made in forward group g of a pipeline of
    ``num_groups`` (G) groups: 2 (G - g) - 1.

    Why: after autodiff the last forward group also runs its own backward, and the backward of group g is
    stage 2G-2-g, so the pipeline has 2G-1 independent stages. PopART sizes a stash as the number of
    independent stages from the stashing stage to its last restoring stage, inclusive
    (``Pipeline::getStashSize`` -> ``numIndependentStages(stashStage, maxRestoreStage + 1)``,
    pipeline.cpp:1477-1482, 2314-2321): (2G-2-g) - g + 1. The last group needs no stash (its forward and
    backward are one stage): depth 1 means nothing is stashed. For Graphcore's layout, heads back on IPU 0,
    a 4-IPU pipeline has G = 5 groups (IPU 0, 1, 2, 3, 0): depths 9, 7, 5, 3, 1."""
    return [2 * (num_groups - g) - 1 for g in range(num_groups)]


def layer_activation_elements(model_config, micro_batch: int, seq_len: int) -> Tuple[int, int]:
    """(kept, peak) activation elements of one encoder layer (estimate): ``kept`` is what its backward reads
    (q, k, v, context, attention-output LayerNorm input and output, FFN input to the second LayerNorm: 7 of
    (B, S, H); the FFN's pre- and post-GELU (B, S, FF); the attention probabilities (B, N, S, S)); ``peak``
    adds the two (B, N, S, S) gradients (of the probabilities and of the scores) live in the attention backward."""
    B, S = micro_batch, seq_len
    H, FF, N = model_config.hidden_size, model_config.intermediate_size, model_config.num_attention_heads
    kept = B * S * (7 * H + 2 * FF) + B * N * S * S
    return kept, kept + 2 * B * N * S * S


def training_activation_bytes(model_config, micro_batch: int, seq_len: int, value_bytes: int) -> float:
    """Activation bytes of a training pass without recomputation (estimate): every encoder layer's ``kept``
    activations live until its backward, and the last layer's ``peak`` (``layer_activation_elements``), at
    ``value_bytes`` a value. The heads' logits are not counted."""
    kept, peak = layer_activation_elements(model_config, micro_batch, seq_len)
    return float(value_bytes * (kept * max(0, model_config.num_hidden_layers - 1) + peak))


def packs_per_pass(model_config, execution: ExecutionConfig, seq_len: int) -> int:
    """How many packs one training pass may hold on the torch backend: as many as whose activations
    (``training_activation_bytes``, linear in the packs; 2 bytes a value under fp16/bf16) fit
    ``execution.pass_memory_mb``, at least 1."""
    value_bytes = 4 if execution.precision == "fp32" else 2
    one = training_activation_bytes(model_config, 1, seq_len, value_bytes)
    return max(1, int(execution.pass_memory_mb * 2**20 // max(one, 1.0)))


def micro_batches_per_pass(model_config, execution: ExecutionConfig, seq_len: int) -> int:
    """How many of a replica's micro batches one pass runs together on the torch backend: as many of the step's
    as ``packs_per_pass`` holds, at least 1; 1 where micro batches are not merged (ExecutionConfig
    ``merges_micro_batches``)."""
    if not execution.merges_micro_batches:
        return 1
    fit = packs_per_pass(model_config, execution, seq_len) // execution.micro_batch_size
    return max(1, min(execution.gradient_accumulation, fit))


def activation_bytes(
    model_config, execution: ExecutionConfig, plan: List[Placement], seq_len: int
) -> Tuple[List[float], List[float], List[int]]:
    """(stash bytes, live activation bytes, stash depth) per IPU (estimates).

    Pipelined (more than one IPU), PopTorch turns on PopART's pipeline recomputation (poptorch
    popart_compiler/source/Compiler.cpp:571-578): in the backward each stage recomputes its forward from
    what it stashed. A group stashes, per micro batch in flight (``stash_depths``):
    - with a recomputation checkpoint on every layer: each layer's output (B, S, H), plus its input (B, S, H)
      when that arrives from another IPU; without: only that input, and the whole group is recomputed;
    - the additive attention mask (B, S, S), in the model's dtype as it builds it (fp16: 2 bytes), when the
      group has layers.
    Live activations: one layer's peak (checkpoints), or all the group's layers kept plus one peak.
    Without pipelining nothing is recomputed and every layer's activations live until its backward."""
    B, S = execution.micro_batch_size, seq_len
    H = model_config.hidden_size
    b = 2 if execution.precision == "fp16" else 4
    kept, peak = layer_activation_elements(model_config, B, S)
    n = execution.num_stages
    stash, live, depth = [0.0] * n, [0.0] * n, [1] * n
    if n == 1:
        live[0] = training_activation_bytes(model_config, B, S, b)
        return stash, live, depth
    groups = pipeline_groups(plan)
    for (ipu, modules), d in zip(groups, stash_depths(len(groups))):
        layers = [p for p in modules if p.module.startswith("bert.encoder.layer.")]
        if not layers:
            continue
        received = modules[0] in layers  # its first layer's input is copied from another IPU
        if execution.recompute_checkpoint_every_layer:
            tensors, unit = len(layers) + int(received), peak
        else:
            tensors, unit = int(received), kept * (len(layers) - 1) + peak
        depth[ipu] = max(depth[ipu], d)
        if d > 1:
            stash[ipu] += d * (tensors * B * S * H * b + B * S * S * b)
        live[ipu] = max(live[ipu], float(unit * b))
    return stash, live, depth


def memory_choices(
    model_config, execution: ExecutionConfig, plan: List[Placement], seq_len: int, mlm_slots: Optional[int] = None
) -> List[Dict[str, Optional[float]]]:
    """Bytes each of Graphcore's memory choices saves per IPU (estimates; docs/model.md "Memory choices"):
    - ``saved_mask``: an fp16 model's mask is fp16, so each stash entry of a group with layers holds (B, S, S)
      at 2 bytes, not 4 (the stash row already counts 2);
    - ``saved_mlm_logits``: the fp32 copy of the (B*M, V) logits the fp16 loss does without, B*M*V*4 on the
      heads' IPU (Graphcore: cross_entropy of fp16 logits, modeling.py:302-304); None without M;
    - ``saved_fused_qkv``: the two extra (B, S, H) partial input gradients of an unfused layer's backward
      (three projections' gradients summed), one layer at a time: 2*B*S*H*b on each IPU with layers, with
      ``model.fused_qkv`` on or (would save) off.
    The last two are not in the total (logits and backward temporaries are not counted); an fp32 model saves
    nothing by the first two."""
    e = execution
    B, S, H, V = e.micro_batch_size, seq_len, model_config.hidden_size, model_config.vocab_size
    b = 2 if e.precision == "fp16" else 4
    rows = [{"saved_mask": 0.0, "saved_mlm_logits": None if mlm_slots is None else 0.0, "saved_fused_qkv": 0.0}
            for _ in range(e.num_stages)]
    if e.num_stages > 1:
        for (ipu, modules), d in zip(pipeline_groups(plan), stash_depths(len(pipeline_groups(plan)))):
            if d > 1 and any(p.module.startswith("bert.encoder.layer.") for p in modules):
                rows[ipu]["saved_mask"] += float(d * B * S * S * (4 - b))
    for p in plan:
        device = p.ipu if e.backend == "poptorch" else p.stage
        if p.module == "cls" and mlm_slots is not None and b == 2:
            rows[device]["saved_mlm_logits"] = float(B * mlm_slots * V * 4)
        if p.module.startswith("bert.encoder.layer."):
            rows[device]["saved_fused_qkv"] = float(2 * B * S * H * b)
    return rows


def memory_per_device(
    model_config, execution: ExecutionConfig, optimizer: str = "lamb", sequence_length: Optional[int] = None,
    mlm_slots: Optional[int] = None, task: str = tasks.PRETRAINING.name,
) -> Tuple[List[Placement], List[Dict[str, float]]]:
    """(placement, one dict per IPU/stage of bytes: params, weights, gradients, optimizer (on chip),
    optimizer_offchip, stream_buffer, stash, activations, total (on chip), stash_depth; and on IPUs the
    savings of ``memory_choices``). ``mlm_slots``: M of the packs (sizes the MLM logits' row)."""
    optimizer = optimizer.lower()
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError("optimizer must be one of %s, got %r" % (sorted(OPTIMIZER_STATES), optimizer))
    seq_len = int(sequence_length or model_config.max_position_embeddings)
    plan = plan_placement(model_config.num_hidden_layers, execution, task)
    counts = module_parameters(model_config, task)
    largest_of = largest_tensors(model_config, task)
    ipu = execution.backend == "poptorch"
    where = [(p.ipu if ipu else p.stage) for p in plan]
    params = [0] * execution.num_stages
    largest = [0] * execution.num_stages
    for p, d in zip(plan, where):
        params[d] += counts[p.module]
        largest[d] = max(largest[d], largest_of[p.module])
    if not ipu and execution.num_stages > 1 and tasks.get(task).has_mlm:
        # torch pipeline: the heads' stage holds its own copy of the tied word embedding
        params[execution.num_stages - 1] += model_config.vocab_size * model_config.hidden_size
    if not ipu:
        rows = []
        for n in params:  # torch: .grad and optimizer state at the weights' fp32 (autocast keeps fp32 weights)
            row = {"params": float(n), "weights": 4.0 * n, "gradients": 4.0 * n,
                   "optimizer": 4.0 * n * OPTIMIZER_STATES[optimizer], "optimizer_offchip": 0.0}
            row["total"] = row["weights"] + row["gradients"] + row["optimizer"]
            rows.append(row)
        return plan, rows
    e = execution
    weight_bytes = 2 if e.precision == "fp16" else 4
    accum_bytes = TYPE_BYTES[e.accumulator_type] if e.gradient_accumulation > 1 else 0
    state_bytes = TYPE_BYTES[e.first_order_momentum_type]
    if OPTIMIZER_STATES[optimizer] == 2:
        state_bytes += TYPE_BYTES[e.second_order_momentum_type]
    shards = e.local_replicas if e.replicated_tensor_sharding else 1
    stash, live, depth = activation_bytes(model_config, e, plan, seq_len)
    saved = memory_choices(model_config, e, plan, seq_len, mlm_slots)
    rows = []
    for d, n in enumerate(params):
        state = float(n * state_bytes) / shards
        row = {
            "params": float(n),
            "weights": float(n * weight_bytes),
            "gradients": float(n * accum_bytes),
            "optimizer": 0.0 if e.optimizer_state_offchip else state,
            "optimizer_offchip": state if e.optimizer_state_offchip else 0.0,
            "stream_buffer": float(largest[d] * state_bytes) / shards if e.optimizer_state_offchip else 0.0,
            "stash": stash[d],
            "activations": live[d],
            "stash_depth": float(depth[d]),
        }
        row["total"] = sum(row[k] for k in ("weights", "gradients", "optimizer", "stream_buffer", "stash",
                                            "activations"))
        row.update(saved[d])
        rows.append(row)
    return plan, rows


def ipu_memory_lines(
    model_config, execution: ExecutionConfig, optimizer: str = "lamb", sequence_length: Optional[int] = None,
    mlm_slots: Optional[int] = None, task: str = tasks.PRETRAINING.name,
) -> List[str]:
    """The per-IPU memory table (one column per IPU), its flags and the PopART pipeline constraint."""
    e = execution
    seq_len = int(sequence_length or model_config.max_position_embeddings)
    plan, rows = memory_per_device(model_config, e, optimizer, seq_len, mlm_slots, task)
    shards = ", /%d" % e.local_replicas if e.replicated_tensor_sharding else ""
    moments = e.first_order_momentum_type
    if OPTIMIZER_STATES[optimizer.lower()] == 2:
        moments += "+" + e.second_order_momentum_type
    groups = pipeline_groups(plan) if e.num_stages > 1 else []
    if not groups:
        live = "no pipeline: all layers"
    else:
        live = "1 layer recomputed" if e.recompute_checkpoint_every_layer else "stage recomputed"
    state = "%s %s%s" % (optimizer.lower(), moments, shards)
    table = [
        ("params", "params", _fmt_count),
        ("weights (%s)" % ("fp16" if e.precision == "fp16" else "fp32"), "weights", _fmt_bytes),
        ("grad accumulators (%s)" % (e.accumulator_type if e.gradient_accumulation > 1 else "none"), "gradients",
         _fmt_bytes),
        ("optimizer state (%s)" % ("off chip" if e.optimizer_state_offchip else state), "optimizer", _fmt_bytes),
        ("* stream buffer (largest tensor%s)" % shards, "stream_buffer", _fmt_bytes),
        ("* stash (depth x B %d x S %d)" % (e.micro_batch_size, seq_len), "stash", _fmt_bytes),
        ("* live activations (%s)" % live, "activations", _fmt_bytes),
        ("total counted", "total", _fmt_bytes),
        ("  of 900 MB", "total", lambda v: "%.1f%%" % (100.0 * v / IPU_MEMORY_BYTES)),
        ("off chip: optimizer (%s)" % state if e.optimizer_state_offchip else "off chip: nothing",
         "optimizer_offchip", _fmt_bytes),
    ]
    half = e.precision == "fp16"
    if mlm_slots is None:
        mlm = "* fp16 MLM loss (M unknown)"
    else:
        mlm = "* fp16 MLM loss: no fp32 logits copy, M %d" % mlm_slots if half else "* fp16 MLM loss (fp32 model: none)"
    fused = "on (model.fused_qkv)" if _fused_qkv(model_config) else "model.fused_qkv off, would save"
    table += [
        ("saved by Graphcore's choices (docs/model.md)", None, None),
        ("* fp16 attention mask (%s)" % ("in the stash above" if half else "fp32 model: none"), "saved_mask",
         _fmt_bytes),
    ] + ([(mlm, "saved_mlm_logits", _fmt_bytes)] if tasks.get(task).has_mlm else []) + [
        ("* fused QKV: %s" % fused, "saved_fused_qkv", _fmt_bytes),
    ]
    width = 44
    lines = ["Memory per IPU (* = estimate; /R = sharded over an instance's R replicas; "
             "see ipu_packing/execution/dry_run.py)"]
    lines.append("  %-*s" % (width, "") + "".join("%11s" % ("IPU %d" % d) for d in range(len(rows))))
    for label, key, fmt in table:
        cells = "" if key is None else "".join("%11s" % ("-" if r[key] is None else fmt(r[key])) for r in rows)
        lines.append(("  %-*s" % (width, label) + cells).rstrip())
    amps = [e.memory_proportion_for(d) for d in range(len(rows))]
    if amps[0] is not None:
        lines.append("  %-*s" % (width, "availableMemoryProportion (not counted)")
                     + "".join("%11.2f" % a for a in amps))
    for d, r in enumerate(rows):
        if r["total"] > IPU_MEMORY_BYTES:
            lines.append("  ABOVE 900 MB: IPU %d counts %s before code and exchange buffers"
                         % (d, _fmt_bytes(r["total"])))
    if groups:
        need = min_gradient_accumulation(len(groups))
        lines.append(
            "  pipeline: %d groups of consecutive blocks on one IPU (IPUs %s), stash depths %s"
            % (len(groups), ", ".join(str(i) for i, _ in groups), ", ".join(str(d) for d in stash_depths(len(groups))))
        )
        lines.append(
            "  PopART needs gradient_accumulation >= %d; this config has %d%s"
            % (need, e.gradient_accumulation,
               "" if e.gradient_accumulation >= need else ": TOO SMALL, PopART refuses it")
        )
    lines.append("  not counted: code, exchange and IPU-copy buffers, matmul temporaries, %s, host streams"
                 % ("MLM logits" if tasks.get(task).has_mlm else "the head's logits"))
    return lines


def dry_run_report(
    model_config,
    execution: ExecutionConfig,
    sequences_per_pack: float = 1.0,
    optimizer: str = "lamb",
    sequence_length: Optional[int] = None,
    mlm_slots: Optional[int] = None,
    task: str = tasks.PRETRAINING.name,
) -> str:
    """The placement of every layer, memory per IPU (vs 900 MB) or stage, the PopTorch options asked for,
    and the batch sizes. ``sequence_length`` (S of the packs; default the model's max_position_embeddings)
    sizes the activation estimates, ``mlm_slots`` (M) the MLM logits' row (pretraining), ``task`` the model's
    (a stages.py TASK: the heads it places)."""
    if not sequences_per_pack >= 1.0:
        raise ValueError("sequences per pack must be >= 1, got %r" % (sequences_per_pack,))
    plan, rows = memory_per_device(model_config, execution, optimizer, sequence_length, mlm_slots, task)
    counts = module_parameters(model_config, task)
    ipu = execution.backend == "poptorch"
    e = execution
    lines = []
    if ipu:
        lines.append(
            "Dry run: poptorch, %d IPU(s) per replica x %d replica(s) = %d IPUs requested (rounded to %d), %s"
            % (e.ipus_per_replica, e.replication_factor, e.ipus_per_replica * e.replication_factor, e.total_ipus,
               e.precision)
        )
        lines += describe_launch(e, tasks.get(task).launcher)
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
    if ipu:
        lines += ipu_memory_lines(model_config, e, optimizer, sequence_length, mlm_slots, task)
        lines.append("")
        lines.append("PopTorch options (build_options, translate_optimizer, DataLoader; describe_options)")
        for key, value in describe_options(e).items():
            lines.append("  %-52s %s" % (key, value))
    else:
        lines.append("Memory per stage: weights (fp32), gradients, %s optimizer state (fp32); activations not counted"
                     % optimizer.lower())
        lines.append("  %-5s %9s %10s %10s %10s %10s" % (unit, "params", "weights", "grads", "optimizer", "total"))
        for d, r in enumerate(rows):
            lines.append("  %-5d %9s %10s %10s %10s %10s"
                         % (d, _fmt_count(r["params"]), _fmt_bytes(r["weights"]), _fmt_bytes(r["gradients"]),
                            _fmt_bytes(r["optimizer"]), _fmt_bytes(r["total"])))
    if not ipu and e.num_stages > 1 and e.replication_factor > 1:
        lines.append("  note: backend torch runs DDP replication or a pipeline, not both: "
                     "make_runner refuses this config")
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
    if ipu and e.num_instances > 1:
        rows_b.append(("per instance per step (x %d replicas, %d instances)"
                       % (e.local_replicas, e.num_instances), e.instance_batch_packs))
    if ipu:
        rows_b.append(("per host call %s (x %d device iterations)"
                       % ("of an instance" if e.num_instances > 1 else "= DataLoader item", e.device_iterations),
                       e.combined_batch_packs))
    for name, packs in rows_b:
        lines.append("  %-58s %8d packs  %10.1f sequences" % (name, packs, packs * spp))
    return "\n".join(lines) + "\n"
