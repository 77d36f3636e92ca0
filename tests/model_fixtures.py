"""The model tests' tiny models and packs: packs laid out by the pack format's reference builder
(data/format.py), a tiny BertConfig and batch (tests/test_model.py and the model tests after it), and the
equivalence setup against transformers (tests/test_model_equivalence.py, test_model_varlen.py,
test_model_fused_qkv.py).

The model tests need packs whose every sequence is also known on its own, so they can run
transformers' BertForPreTraining on the same sequences unpacked. The field meanings are format.py's;
on top of them, unused MLM / NSP slots here get arbitrary positions, to prove the model never reads them
(tests/test_model.py checks the helper keeps them).
"""


from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np
import torch
import transformers

from ipu_packing.data.format import IGNORE_INDEX, as_batch
from ipu_packing.data.reference import Instance, pack_sequences
from ipu_packing.model import PackedBertForPreTraining, PackedBertOutput


def random_sequence(rng: np.random.Generator, length: int, vocab_size: int, max_masked: int = 3) -> Instance:
    """A random sequence: token 0 is [CLS] (never masked), two segments, up to ``max_masked`` masked tokens.

    Not data/random_instances.py's NSP/MLM rule, on purpose: the model tests need predictions in sequences of
    2 and 3 tokens, ids drawn over the whole vocabulary (special ids included) and labels unrelated to the
    ids, to show that the packed model matches transformers' whatever the tokens hold."""
    ids = rng.integers(1, vocab_size, size=length)
    split = max(1, length // 2)
    types = np.array([0] * split + [1] * (length - split))
    count = int(min(length - 1, rng.integers(1, max_masked + 1)))
    positions = np.sort(rng.choice(np.arange(1, length), size=count, replace=False))
    labels = rng.integers(0, vocab_size, size=count)
    return Instance(ids, types, positions, labels, int(rng.integers(0, 2)))


def build_packs(
    packs: Sequence[Sequence[Instance]], seq_len: int, max_sequences: int, mlm_slots: int, rng: np.random.Generator
) -> Dict[str, np.ndarray]:
    """pack_sequences(packs, S, K, M) as int32 arrays (B, S), (B, M), (B, K), except that unused MLM / CLS
    slots get a random position (in or out of range): the model must never read them."""
    batch = as_batch(pack_sequences(packs, seq_len, max_sequences, mlm_slots))
    for positions, labels in (("mlm_positions", "mlm_labels"), ("cls_positions", "nsp_labels")):
        noise = rng.integers(-200, 200, size=batch[positions].shape).astype(np.int32)
        batch[positions] = np.where(batch[labels] == IGNORE_INDEX, noise, batch[positions])
    return batch


def to_torch(batch: Dict[str, np.ndarray], dtype: torch.dtype = torch.int64) -> Dict[str, torch.Tensor]:
    return {key: torch.as_tensor(value).to(dtype) for key, value in batch.items()}


def padded_hf_inputs(sequences: List[Instance]) -> Dict[str, torch.Tensor]:
    """The same sequences unpacked, one per row, right-padded: the inputs of transformers' BertForPreTraining."""
    width = max(len(seq) for seq in sequences)
    count = len(sequences)
    input_ids = torch.zeros((count, width), dtype=torch.long)
    token_type_ids = torch.zeros((count, width), dtype=torch.long)
    attention_mask = torch.zeros((count, width), dtype=torch.long)
    labels = torch.full((count, width), IGNORE_INDEX, dtype=torch.long)
    for row, seq in enumerate(sequences):
        length = len(seq)
        input_ids[row, :length] = torch.as_tensor(seq.input_ids)
        token_type_ids[row, :length] = torch.as_tensor(seq.token_type_ids)
        attention_mask[row, :length] = 1
        labels[row, torch.as_tensor(seq.mlm_positions)] = torch.as_tensor(seq.mlm_labels)
    next_sentence_label = torch.tensor([seq.nsp_label for seq in sequences], dtype=torch.long)
    return dict(
        input_ids=input_ids,
        token_type_ids=token_type_ids,
        attention_mask=attention_mask,
        labels=labels,
        next_sentence_label=next_sentence_label,
    )


def random_packs(rng: np.random.Generator, lengths: Sequence[Sequence[int]], vocab_size: int):
    """Random sequences grouped as ``lengths`` (one list of sequence lengths per pack)."""
    return [[random_sequence(rng, length, vocab_size) for length in group] for group in lengths]


# ---- a tiny model and batch (tests/test_model.py) -----------------------------------------------------------

FIELDS = ("loss", "mlm_loss", "nsp_loss", "mlm_logits", "nsp_logits", "mlm_accuracy", "nsp_accuracy",
          "mlm_count", "nsp_count")


def tiny_config(**overrides) -> transformers.BertConfig:
    fields = dict(
        vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        initializer_range=0.2,
    )
    fields.update(overrides)
    return transformers.BertConfig(**fields)


def tiny_batch(seed: int = 0, dtype: torch.dtype = torch.int64, lengths=([5, 6], [9], [3, 3, 4, 6])):
    rng = np.random.default_rng(seed)
    return to_torch(build_packs(random_packs(rng, lengths, 64), 16, 4, 10, rng), dtype)


def model_for(attention: str = "dense", seed: int = 0, **overrides) -> PackedBertForPreTraining:
    torch.manual_seed(seed)
    return PackedBertForPreTraining(tiny_config(**overrides), attention=attention).eval()


def assert_outputs_close(a: PackedBertOutput, b: PackedBertOutput, atol: float) -> None:
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape, name
        assert (x.float() - y.float()).abs().max().item() <= atol, (name, (x - y).abs().max().item())


# ---- packed against unpacked transformers (tests/test_model_equivalence.py) -------------------------------------

SEQ_LEN = 32
MAX_SEQUENCES = 8
MLM_SLOTS = 24
# Packs of 1, 2, 3 and 8 sequences; the first three end in padding, the last is full (8 lengths sum to 32).
PACK_LENGTHS = [[20], [10, 14], [5, 9, 11], [3, 5, 2, 6, 4, 4, 5, 3]]

CONFIGS = {
    "L2-H2-d32-V97": dict(num_hidden_layers=2, num_attention_heads=2, hidden_size=32, vocab_size=97),
    "L3-H4-d64-V211": dict(num_hidden_layers=3, num_attention_heads=4, hidden_size=64, vocab_size=211),
    "L1-H1-d24-V1000-gelu_new": dict(
        num_hidden_layers=1, num_attention_heads=1, hidden_size=24, vocab_size=1000, hidden_act="gelu_new"
    ),
}

# float32: what rounding leaves of the equality (measured worst case: logits 3.1e-6 with sdpa, loss 2.3e-7
# relative, gradients 3.4e-7); float64: the proof of mathematical equality (measured at most 6.2e-15).
LOGIT_ATOL = 1e-5
LOSS_RTOL = 1e-6
GRAD_ATOL = 1e-5
FP64_ATOL = 1e-12


def make_config(**fields) -> transformers.BertConfig:
    fields.setdefault("intermediate_size", 2 * fields["hidden_size"])
    return transformers.BertConfig(
        max_position_embeddings=64, type_vocab_size=2, attn_implementation="eager", **fields
    )


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Weights far from the default init (std 0.02 makes every logit ~0 and hides mistakes)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if "LayerNorm.weight" in name:
                param.copy_(1.0 + 0.1 * noise)
            else:
                param.copy_(0.15 * noise)


def twin_models(config: transformers.BertConfig, attention: str, seed: int = 0):
    """transformers' reference and the packed model, holding identical weights."""
    reference = transformers.BertForPreTraining(config)
    assert type(reference.bert.encoder.layer[0].attention.self).__name__ == "BertSelfAttention"  # eager
    randomize_(reference, seed)
    packed = PackedBertForPreTraining(config, attention=attention)
    packed.load_state_dict(reference.state_dict())
    return reference.eval(), packed.eval()


def run_both(config_fields, attention, lengths=PACK_LENGTHS, seed=0):
    config = make_config(**config_fields)
    reference, packed = twin_models(config, attention, seed)
    rng = np.random.default_rng(seed)
    groups = random_packs(rng, lengths, config.vocab_size)
    batch = to_torch(build_packs(groups, SEQ_LEN, MAX_SEQUENCES, MLM_SLOTS, rng))
    sequences = [seq for group in groups for seq in group]
    hf_inputs = padded_hf_inputs(sequences)
    return reference, packed, groups, batch, hf_inputs


def gather_reference(groups, batch, hf_out, hf_inputs):
    """Map the reference's per-sequence outputs onto the packed slots: (B, M, V) and (B, K, 2) targets."""
    dtype = hf_out.prediction_logits.dtype
    mlm_ref = torch.zeros(batch["mlm_labels"].shape + (hf_out.prediction_logits.shape[-1],), dtype=dtype)
    nsp_ref = torch.zeros(batch["nsp_labels"].shape + (2,), dtype=dtype)
    row_of = 0
    for b, group in enumerate(groups):
        slot = 0
        for k, seq in enumerate(group):
            nsp_ref[b, k] = hf_out.seq_relationship_logits[row_of]
            for position in seq.mlm_positions:
                mlm_ref[b, slot] = hf_out.prediction_logits[row_of, int(position)]
                slot += 1
            row_of += 1
    return mlm_ref, nsp_ref


OWN_WORDS = ["the", "a", "loop", "task", "mail", "header", "socket", "server", "test", "case", "good", "bad", "##s",
             ".", ",", "caf", "##e", "cafe", "au", "lait", "\u4e2d", "\u6587", "\u4e2d\u6587"]
"""The words of the tests' own small vocabulary (save_hf_bert): ASCII words, an accent-free "cafe" and two CJK
characters that are tokens alone and together."""


def save_hf_bert(directory: str, cls: str = "BertForPreTraining", words: Sequence[str] = OWN_WORDS,
                 tokenizer_config: Dict = None, seed: int = 0, **fields) -> str:
    """A tiny transformers BERT (``cls`` of transformers) saved by its own save_pretrained into ``directory``, with a
    vocabulary and a layer_norm_eps of its own (the special tokens, then ``words``; eps 1e-7, hidden 32, 2 layers,
    64 positions unless ``fields`` say otherwise), its vocab.txt and, where given, its tokenizer_config.json."""
    import json
    import os

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(words)
    settings = dict(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=64, layer_norm_eps=1e-7, hidden_act="gelu")
    settings.update(fields)
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(transformers.BertConfig(**settings))
    model.save_pretrained(directory)
    with open(os.path.join(directory, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("".join(token + "\n" for token in vocab))
    if tokenizer_config is not None:
        with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(tokenizer_config, f)
    return directory
