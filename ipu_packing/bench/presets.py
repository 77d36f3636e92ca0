"""Model sizes of the benches: the one table `python -m ipu_packing.bench --model` takes its BERT shapes from in
every mode that builds its own model (training configs give their own).

    transformers.BertConfig(**MODEL_PRESETS["small"], max_position_embeddings=512)

Each preset is a set of transformers.BertConfig overrides; intermediate_size is 4 * hidden_size throughout.
It imports nothing: under ipu_packing.model it would bring torch into every bench command's start-up.
"""

from __future__ import annotations

from typing import Dict

MODEL_PRESETS: Dict[str, Dict[str, int]] = {
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512, vocab_size=8192),
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                  vocab_size=30522),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                 vocab_size=30522),
    "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                  vocab_size=30522),
}
