"""Packs and twin models for the task-head tests (tests/test_model_classification.py,
tests/test_model_question_answering.py, tests/test_model_task_checkpoint.py, tests/test_model_task_stages.py).

Packs of random sequences with random lengths, laid out by the pack format's reference builder (the token
fields of data/format.py; the MLM fields are there too and unused by the heads): some packs full, some ending
in padding, some with every slot but one empty. Every sequence is also kept on its own, so transformers'
model of the same task can run it alone (a batch of one, unpadded). The twins hold identical weights far
from the default initialisation (model_fixtures.randomize_), in eval mode (no dropout).
"""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import torch

from ipu_packing.model.self_attention import hf_layout
from model_fixtures import build_packs, make_config, random_packs, randomize_, to_torch

SEQ_LEN = 32
MAX_SEQUENCES = 6
MLM_SLOTS = 3 * MAX_SEQUENCES  # random_sequence masks at most 3 tokens per sequence
TINY = dict(num_hidden_layers=2, num_attention_heads=2, hidden_size=32, vocab_size=97)


def random_lengths(rng: np.random.Generator, num_packs: int, seq_len: int = SEQ_LEN, max_sequences: int = MAX_SEQUENCES,
                   min_length: int = 2) -> List[List[int]]:
    """A pack of one sequence followed by padding, a full pack of ``max_sequences`` sequences, then
    ``num_packs`` packs of 1..max_sequences sequences of random lengths >= ``min_length``, full or padded."""
    groups = [[seq_len - 7], []]
    base = seq_len // max_sequences
    groups[1] = [base] * (max_sequences - 1) + [seq_len - base * (max_sequences - 1)]
    for _ in range(num_packs):
        k = int(rng.integers(1, max_sequences + 1))
        total = seq_len if rng.integers(0, 2) else int(rng.integers(k * min_length, seq_len + 1))
        extra = rng.multinomial(total - k * min_length, np.ones(k) / k)
        groups.append([int(min_length + e) for e in extra])
    return groups


def task_packs(seed: int = 0, num_packs: int = 6, vocab_size: int = TINY["vocab_size"], lengths=None):
    """(groups of Instances, batch of int64 tensors): random sequences packed as ``lengths`` (default:
    random_lengths)."""
    rng = np.random.default_rng(seed)
    if lengths is None:
        lengths = random_lengths(rng, num_packs)
    groups = random_packs(rng, lengths, vocab_size)
    batch = to_torch(build_packs(groups, SEQ_LEN, MAX_SEQUENCES, MLM_SLOTS, rng))
    return groups, batch


def alone(sequence) -> Dict[str, torch.Tensor]:
    """transformers' inputs for one sequence on its own: a batch of one, no padding (positions 0..l-1 and an
    all-ones attention mask are transformers' defaults)."""
    return dict(input_ids=torch.as_tensor(sequence.input_ids, dtype=torch.long)[None],
                token_type_ids=torch.as_tensor(sequence.token_type_ids, dtype=torch.long)[None])


def slots(groups) -> List[tuple]:
    """(pack, slot, sequence) of every real sequence, in pack order."""
    return [(b, k, seq) for b, group in enumerate(groups) for k, seq in enumerate(group)]


def twins(hf_class: Any, packed_class: Any, attention: str, seed: int = 0, **fields):
    """transformers' model and the packed one of the same task, identical weights, eval mode."""
    config = make_config(**dict(TINY, **fields))
    torch.manual_seed(seed)
    reference = hf_class(config)
    assert type(reference.bert.encoder.layer[0].attention.self).__name__ == "BertSelfAttention"  # eager
    randomize_(reference, seed)
    packed = packed_class(config, attention=attention)
    packed.load_state_dict(reference.state_dict())
    return reference.eval(), packed.eval()


def hf_gradients(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """Every parameter's gradient under transformers' name (a fused qkv split back into query/key/value)."""
    return hf_layout({name: p.grad for name, p in model.named_parameters()})


def scaled_difference(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """max |ours - theirs| / max(1, max |theirs|): absolute for values of order one or less, relative for
    larger ones."""
    ours, theirs = ours.detach().double(), theirs.detach().double()
    return (ours - theirs).abs().max().item() / max(1.0, theirs.abs().max().item())


def flex_missing() -> Any:
    """Why attention 'flex' cannot run here (forward), or None."""
    from ipu_packing.model.attention import missing_torch_support

    return missing_torch_support("flex")


def flex_backward_missing() -> Any:
    """Why FlexAttention cannot run a backward here (torch has none on CPU), or None."""
    if flex_missing():
        return flex_missing()
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    q = torch.randn(1, 1, 16, 8, requires_grad=True)
    mask = create_block_mask(lambda b, h, i, j: i >= j, 1, None, 16, 16, device="cpu")
    try:
        flex_attention(q, q, q, block_mask=mask).sum().backward()
    except NotImplementedError as error:  # "FlexAttention does not support backward on CPU"
        return "torch %s: %s" % (torch.__version__, str(error).splitlines()[0])
    return None


def gradient_differences(packed: torch.nn.Module, reference: torch.nn.Module) -> Dict[str, float]:
    """scaled_difference of every parameter's gradient (the same names on both sides, asserted)."""
    ours, theirs = hf_gradients(packed), {n: p.grad for n, p in reference.named_parameters()}
    assert sorted(ours) == sorted(theirs)
    out = {}
    for name, grad in ours.items():
        assert grad is not None and theirs[name] is not None, name
        out[name] = scaled_difference(grad, theirs[name])
    return out


__all__ = ["alone", "flex_backward_missing", "flex_missing", "gradient_differences", "hf_gradients",
           "random_lengths", "scaled_difference", "slots", "task_packs", "twins"]
