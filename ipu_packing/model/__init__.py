"""Packed BERT for pretraining (single device; placement is applied from outside).

CONTRACT (the model work fills this in; other packages rely on exactly these names):

    from ipu_packing.model import PackedBertForPreTraining, PackedBertOutput
    model = PackedBertForPreTraining(transformers.BertConfig(...))
    out = model(input_ids=..., token_type_ids=..., position_ids=..., sequence_ids=...,
                mlm_positions=..., mlm_labels=..., cls_positions=..., nsp_labels=...)
    out.loss, out.mlm_loss, out.nsp_loss          # scalars
    out.mlm_logits  # (B, M, V)    out.nsp_logits  # (B, K, 2)
    out.mlm_accuracy, out.nsp_accuracy            # scalars
    out.mlm_count, out.nsp_count                  # scalars: valid slots / sequences in the batch

Submodules follow transformers' BertForPreTraining names: model.bert.embeddings,
model.bert.encoder.layer (nn.ModuleList), model.bert.pooler, model.cls.predictions,
model.cls.seq_relationship.
"""
