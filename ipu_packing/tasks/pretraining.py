"""BERT pretraining on packs, as google-research/bert's run_pretraining.py trains it: MLM per masked token, NSP
per sequence from its own [CLS].

- fields: the four (S,) token fields, the (M,) masked positions and labels, each sequence's [CLS] and NSP label;
  no `task` entry in the manifest.
- preparation: a corpus -> documents -> NSP/MLM instances (data/text/pipeline.py, create_pretraining_data.py's
  recipe in data/text/recipe.py), or an existing dataset packed as it is (data/existing/).
- model: PackedBertForPreTraining (model/modeling.py); its parts: model/stages.py pretraining_stages.
- metrics: the loss, its MLM and NSP parts, MLM and NSP accuracy; no held-out evaluation; export: transformers'
  BertForPreTraining.
"""

from __future__ import annotations

from .spec import TOKEN_FIELDS, Task

PRETRAINING = Task(
    name="pretraining",
    fields=TOKEN_FIELDS + ("mlm_positions", "mlm_labels", "cls_positions", "nsp_labels"),
    metrics=("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"),
    first_metrics=("loss", "mlm_accuracy"),
    last_metrics=("loss", "mlm_accuracy", "nsp_accuracy"),
    export="BertForPreTraining",
    labels={"mlm_accuracy": "MLM accuracy", "nsp_accuracy": "NSP accuracy"},
    compared=("mlm_loss", "mlm_accuracy", "nsp_accuracy"),
    presence="nsp_labels",
    launcher="run_pretraining.py",
    inputs="--input: a corpus",
    hooks={
        "broken_slots": "ipu_packing.data.shards:broken_mlm_slots",
        "first_broken_slot": "ipu_packing.data.shards:first_broken_mlm_slot",
        "check_prepare": "ipu_packing.data.text.pipeline:check_corpus_options",
        "prepare": "ipu_packing.data.text.pipeline:prepare_corpus",
        "prepared": "ipu_packing.data.text.pipeline:prepared_lines",
        "model": "ipu_packing.model.modeling:PackedBertForPreTraining",
        "stages": "ipu_packing.model.stages:pretraining_stages",
    },
)

__all__ = ["PRETRAINING"]
