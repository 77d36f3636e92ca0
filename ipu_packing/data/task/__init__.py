"""`prepare --task classification`'s own room: fine-tuning data in the convention of transformers' run_glue.py
(inputs: CSV, TSV, JSON Lines, Parquet or a Hugging Face `datasets` directory), its labels (labels), its
tokenization with the model's own tokenizer in the worker processes (encode), the embedded demo task (demo),
orchestrated with the shared write phase by pipeline. The packs are the one pack format's classification field
set (data/format.py)."""
