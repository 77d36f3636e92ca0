"""A tokenizer directory is read with every option transformers reads: tokenizer_config.json's
`tokenize_chinese_chars`, `strip_accents` and `do_lower_case` beside a vocab.txt (BertTokenizer) and over
tokenizer.json's BertNormalizer (BertTokenizerFast rebuilds it from them). Each case's ids are checked against
transformers' own BertTokenizer and BertTokenizerFast loaded from the same directory, on CJK, casing and accent
texts; the options go into the manifest and the export's tokenizer_config.json."""

from __future__ import annotations

import json
import os

import pytest
import transformers

import model_fixtures as mf
from ipu_packing.data.vocab import hf_tokenizer_files, load_tokenizer, tokenizer_options

TEXTS = ["the \u4e2d\u6587 loop", "\u4e2d\u6587", "The Loop, a MAIL.", "Caf\u00e9 au lait", "Cafe\u0301 au lait",
         "a\u4e2d\u6587b test", "THE SERVER"]


CASED_WORDS = ["The", "Loop", "MAIL"]
"""Tokens with capitals (after OWN_WORDS): a cased vocabulary, whose casing transformers still reads from the
directory's files (its defaults where they are silent), never from the tokens."""


def _vocab_dir(directory, tokenizer_config=None, json_normalizer=None):
    """The tests' own vocabulary (model_fixtures.OWN_WORDS: "\u4e2d\u6587" a token of its own, "cafe" with no accent)
    as vocab.txt, with a tokenizer_config.json and, where ``json_normalizer`` is given (BertWordPieceTokenizer's
    options), a tokenizer.json."""
    from tokenizers.implementations import BertWordPieceTokenizer

    os.makedirs(directory, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(mf.OWN_WORDS) + list(CASED_WORDS)
    with open(os.path.join(directory, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("".join(t + "\n" for t in vocab))
    if tokenizer_config is not None:
        with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(dict(tokenizer_config, tokenizer_class="BertTokenizer"), f)
    if json_normalizer is not None:
        BertWordPieceTokenizer({t: i for i, t in enumerate(vocab)}, **json_normalizer).save(
            os.path.join(directory, "tokenizer.json"))
    return directory


# (id, tokenizer_config.json's options or None (no such file), tokenizer.json's BertNormalizer options or None (a
# vocab.txt alone))
CASES = [
    ("vocab-txt-chinese-chars-off", {"do_lower_case": True, "tokenize_chinese_chars": False}, None),
    ("vocab-txt-chinese-chars-on", {"do_lower_case": True, "tokenize_chinese_chars": True}, None),
    ("vocab-txt-cased-keeps-accents", {"do_lower_case": False, "strip_accents": False}, None),
    ("vocab-txt-uncased-keeps-accents", {"do_lower_case": True, "strip_accents": False}, None),
    ("json-cased-config-lower-cases", {"do_lower_case": True},
     {"lowercase": False, "strip_accents": None, "handle_chinese_chars": True}),
    ("json-uncased-config-cased", {"do_lower_case": False},
     {"lowercase": True, "strip_accents": None, "handle_chinese_chars": True}),
    ("json-splits-chinese-config-does-not", {"do_lower_case": True, "tokenize_chinese_chars": False},
     {"lowercase": True, "strip_accents": None, "handle_chinese_chars": True}),
    ("json-and-config-agree", {"do_lower_case": True, "strip_accents": True},
     {"lowercase": True, "strip_accents": True, "handle_chinese_chars": True}),
    ("vocab-txt-alone", None, None),
    ("vocab-txt-config-silent", {}, None),
    ("json-cased-no-config", None, {"lowercase": False, "strip_accents": None, "handle_chinese_chars": True}),
    ("json-cased-config-silent", {}, {"lowercase": False, "strip_accents": False, "handle_chinese_chars": True}),
]


@pytest.mark.parametrize("name, config, normalizer", CASES, ids=[c[0] for c in CASES])
def test_ids_are_transformers_own(name, config, normalizer, tmp_path):
    directory = _vocab_dir(str(tmp_path / "tok"), config, normalizer)
    mine = load_tokenizer(directory).encoder()(TEXTS)
    classes = [transformers.BertTokenizerFast] + ([transformers.BertTokenizer] if normalizer is None else [])
    for cls in classes:
        theirs = cls.from_pretrained(directory)(TEXTS, add_special_tokens=False)["input_ids"]
        assert mine == theirs, (cls.__name__, [t for t, a, b in zip(TEXTS, mine, theirs) if a != b])


def test_the_cases_differ_where_the_options_do(tmp_path):
    """The table's options matter for these texts: CJK split or not, lower-cased or not."""
    off = load_tokenizer(_vocab_dir(str(tmp_path / "off"), CASES[0][1])).encoder()(TEXTS[:1])
    on = load_tokenizer(_vocab_dir(str(tmp_path / "on"), CASES[1][1])).encoder()(TEXTS[:1])
    assert len(off[0]) == len(on[0]) - 1  # "\u4e2d\u6587" one token, or two
    lowered = load_tokenizer(_vocab_dir(str(tmp_path / "json"), *CASES[4][1:])).encoder()(["THE SERVER"])
    assert lowered == [[5, 12]]  # "the", "server"


def test_the_options_go_into_the_manifest_and_the_export(tmp_path):
    spec = load_tokenizer(_vocab_dir(str(tmp_path / "tok"), CASES[0][1]))
    fields = spec.write_vocab(str(tmp_path))
    assert fields["tokenize_chinese_chars"] is False and "strip_accents" not in fields
    options = tokenizer_options(fields)
    assert options == {"do_lower_case": True, "strip_accents": True, "tokenize_chinese_chars": False}
    config = hf_tokenizer_files(model_max_length=32, **options)["tokenizer_config.json"]
    assert config["tokenize_chinese_chars"] is False
    default = load_tokenizer(_vocab_dir(str(tmp_path / "default"), CASES[1][1])).write_vocab(str(tmp_path))
    assert "tokenize_chinese_chars" not in default  # a manifest says only what differs from the default


# (id, tokenizer_config.json's text, the refusal's words)
BAD_CONFIGS = [
    ("a-list", "[]", "tokenizer_config.json: not a JSON object"),
    ("lower-case-a-word", '{"do_lower_case": "yes"}', "tokenizer_config.json: do_lower_case should be true or false"),
    ("chinese-chars-a-word", '{"tokenize_chinese_chars": "no"}',
     "tokenizer_config.json: tokenize_chinese_chars should be true or false"),
    ("strip-accents-a-number", '{"strip_accents": 1}', "tokenizer_config.json: strip_accents should be true, false"),
]


@pytest.mark.parametrize("with_json", [False, True], ids=["vocab-txt", "tokenizer-json"])
@pytest.mark.parametrize("text, words", [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_a_tokenizer_config_that_is_not_options_is_one_line(text, words, with_json, tmp_path):
    """tokenizer_config.json's options are read as transformers reads them, so a value it could not take (a word for
    a boolean; a list for the file) is refused naming the file and the key, not taken for its truth value or ended
    in a traceback."""
    from ipu_packing.errors import DataError

    directory = _vocab_dir(str(tmp_path / "tok"), None, {"lowercase": True} if with_json else None)
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        f.write(text)
    with pytest.raises(DataError) as refused:
        load_tokenizer(directory)
    assert words in str(refused.value), str(refused.value)
