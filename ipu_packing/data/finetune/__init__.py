"""`prepare --task`'s own room: fine-tuning data.

classification, in the convention of transformers' run_glue.py: rows (a split's CSV, TSV, JSON Lines, Parquet or
Hugging Face `datasets` input, row by row), its columns and labels (labels), its tokenization with the model's own
tokenizer in the worker processes (encode), the embedded demo task (demo), orchestrated with the shared write phase
by preparation. The packs are the one pack format's classification field set (data/format.py).

Extractive question answering, in the convention of transformers' run_qa.py: questions (SQuAD v1.1 JSON or run_qa.py's
columns, checked; the examples file beside the packs, its one writer and reader), windows (question + context
windows with stride, answer positions and token offsets, in the workers), the embedded demo task (qa_demo: cloze
questions on the default corpus), orchestrated by qa_preparation with the same write phase; answers (after the
model: each question's best span from the token logits, and the official SQuAD v1.1 exact match and F1). The packs
are the question-answering field set.
"""
