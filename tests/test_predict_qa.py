"""Packed inference for question answering (python -m ipu_packing.predict on a BertForQuestionAnswering directory):
questions from SQuAD JSON or JSON Lines, cut into windows as prepare cuts them, packed, scored and answered by
data/finetune/answers.py; each answer is what transformers' run_qa.py gives on the same directory: its tokenizer's
windows, transformers' BertForQuestionAnswering on each window alone, its post-processing (tests/qa_reference.py).
The data: the demo task's validation questions (data/finetune/qa_demo.py), the default vocabulary, a random
model. What the command guarantees for every task it serves, question answering among them: test_predict_tasks.py."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch

from ipu_packing.data import open_dataset
from ipu_packing.data.finetune.questions import read_examples
from ipu_packing.predict import main
from qa_reference import run_qa_postprocess

pytestmark = pytest.mark.usefixtures("one_thread")

QUERY = 32
SHAPES = [(64, 16), (256, 64)]  # (S, doc stride): at 64 most questions have several windows, at 256 most packs
# hold windows of several questions
QUESTIONS = 60


@pytest.fixture(scope="module")
def qa_model(tmp_path_factory, qa_demo_task):
    """(a transformers BertForQuestionAnswering directory, random weights, with the export's tokenizer files; the
    demo's first QUESTIONS validation questions, shuffled)."""
    import transformers

    from ipu_packing.data.vocab import read_vocab, write_export_tokenizer

    root = tmp_path_factory.mktemp("qa")
    out = qa_demo_task
    ds = open_dataset(os.path.join(out, "validation", "packed"), as_tensors=False)
    model_dir = str(root / "model")
    os.makedirs(model_dir)
    shutil.copy(os.path.join(ds.directory, "vocab.txt"), model_dir)
    write_export_tokenizer(model_dir, ds.manifest, 256)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(read_vocab(os.path.join(model_dir, "vocab.txt"))),
                                     hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=256)
    transformers.BertForQuestionAnswering(config).save_pretrained(model_dir)
    examples = read_examples(ds.directory, ds.manifest)[:QUESTIONS]
    order = np.random.default_rng(0).permutation(len(examples))
    return model_dir, [examples[i] for i in order]


def run_qa_answers(model_dir, examples, S, STRIDE):
    """run_qa.py on each question: its tokenizer call, the model on each window alone, its post-processing."""
    import transformers

    tokenizer = transformers.BertTokenizerFast.from_pretrained(model_dir)
    model = transformers.BertForQuestionAnswering.from_pretrained(model_dir).eval()
    features = []
    for i, example in enumerate(examples):
        enc = tokenizer(example.question, example.context, truncation="only_second", max_length=S, stride=STRIDE,
                        return_overflowing_tokens=True, return_offsets_mapping=True)
        for w in range(len(enc["input_ids"])):
            ids = torch.tensor([enc["input_ids"][w]])
            with torch.no_grad():
                out = model(input_ids=ids, token_type_ids=torch.tensor([enc["token_type_ids"][w]]))
            sequence_ids = enc.sequence_ids(w)
            offsets = [o if sequence_ids[t] == 1 else None for t, o in enumerate(enc["offset_mapping"][w])]
            features.append((i, out.start_logits[0].numpy(), out.end_logits[0].numpy(), offsets))
    return run_qa_postprocess(examples, features)


def write_jsonl(path, examples, answers=False):
    with open(path, "w") as f:
        for e in examples:
            row = {"id": e.id, "question": e.question, "context": e.context}
            if answers:
                row["answers"] = {"text": list(e.answer_texts), "answer_start": list(e.answer_starts)}
            f.write(json.dumps(row) + "\n")


def write_squad(path, examples):
    paragraphs = [{"context": e.context, "qas": [{"id": e.id, "question": e.question, "answers": [
        {"text": t, "answer_start": s} for t, s in zip(e.answer_texts, e.answer_starts)]}]} for e in examples]
    with open(path, "w") as f:
        json.dump({"version": "1.1", "data": [{"title": "demo", "paragraphs": paragraphs}]}, f)


def predict(model_dir, input_path, output_path, capsys, S, STRIDE):
    code = main(["--model", model_dir, "--input", input_path, "--output", output_path, "--max-seq-length", str(S),
                 "--doc-stride", str(STRIDE), "--max-query-length", str(QUERY), "--max-sequences-per-pack", "4"])
    err = capsys.readouterr()[1]
    assert code == 0, err
    return [json.loads(line) for line in open(output_path)]


@pytest.mark.parametrize("S, STRIDE", SHAPES, ids=["S64", "S256"])
def test_answers_are_run_qas_in_input_order_from_json_lines_or_squad_json(qa_model, tmp_path, capsys, S, STRIDE):
    model_dir, examples = qa_model
    theirs = run_qa_answers(model_dir, examples, S, STRIDE)
    write_jsonl(str(tmp_path / "questions.jsonl"), examples)
    got = predict(model_dir, str(tmp_path / "questions.jsonl"), str(tmp_path / "out.jsonl"), capsys, S, STRIDE)
    assert [r["id"] for r in got] == [e.id for e in examples]
    assert all(set(r) == {"id", "prediction_text"} for r in got)
    assert {r["id"]: r["prediction_text"] for r in got} == dict(theirs)
    assert sum(1 for r in got if r["prediction_text"]) == len(got)  # a random model still picks a span
    write_squad(str(tmp_path / "squad.json"), examples)
    assert predict(model_dir, str(tmp_path / "squad.json"), str(tmp_path / "squad_out.jsonl"), capsys, S, STRIDE) == got
    write_jsonl(str(tmp_path / "answered.jsonl"), examples, answers=True)
    assert predict(model_dir, str(tmp_path / "answered.jsonl"), str(tmp_path / "a_out.jsonl"), capsys, S, STRIDE) == got


def test_questions_have_several_windows_and_packs_hold_several_questions(qa_model):
    """The packing under test is real: at S=64 most questions have several windows (the answer chosen across
    them), at S=256 most packs hold windows of several questions (each answer from its own window)."""
    from ipu_packing.predict import QuestionAnswerer

    model_dir, examples = qa_model
    counts = {}
    for S, STRIDE in SHAPES:
        answerer = QuestionAnswerer.from_pretrained(model_dir, S, STRIDE, QUERY, 4)
        packs = answerer.packs([e.question for e in examples], [e.context for e in examples])
        example_ids = packs.arrays["example_ids"]  # (P, K)
        mixed = sum(len(set(row[row >= 0].tolist())) > 1 for row in example_ids)
        counts[S] = (int((packs.arrays["feature_ids"] >= 0).sum()), len(example_ids), mixed)
    print("%d questions; (windows, packs, packs of several questions) by S: %s" % (len(examples), counts))
    assert counts[64][0] > 1.5 * len(examples) and counts[256][2] > counts[256][1] // 2
