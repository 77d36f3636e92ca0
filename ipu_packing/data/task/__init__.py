"""`prepare --task classification`'s own room: fine-tuning data in the convention of transformers' run_glue.py
(rows: a split's CSV, TSV, JSON Lines, Parquet or Hugging Face `datasets` input, row by row), its columns and labels
(labels), its tokenization with the model's own tokenizer in the worker processes (encode), the embedded demo task
(demo), orchestrated with the shared write phase by preparation. The packs are the one pack format's classification
field set (data/format.py)."""
