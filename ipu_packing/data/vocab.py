"""Tokenizers: a vocab.txt, a Hugging Face tokenizer directory, or a WordPiece vocabulary trained on
the corpus being prepared (`prepare --train-vocab N`; the embedded default corpus gets one without asking).

All of them end up as a fast (Rust) `tokenizers.Tokenizer` that encodes whole batches of sentences
at once, plus the vocabulary as a list of tokens (id = index) that is copied into every prepared
dataset as vocab.txt, so the application can rebuild the tokenizer from the data directory alone.

Lower-casing follows the tokenizer, read with every option transformers reads: a Hugging Face directory says so in
tokenizer_config.json (`do_lower_case`, `strip_accents`, `tokenize_chinese_chars`, as transformers' BertTokenizer
reads them beside a vocab.txt, and as BertTokenizerFast rebuilds tokenizer.json's BertNormalizer from them), each
at transformers' default where the file is silent or absent (lower-cased, accents stripped as it lower-cases, CJK
characters split); a bare vocab.txt (a file, not a directory) is treated as uncased when
none of its ordinary tokens holds an upper-case letter (bert-base-uncased) and as cased otherwise
(bert-base-cased). `--lower-case yes|no` overrides the guess for a bare vocab.txt and chooses for a
trained vocabulary (auto: lower-cased); against a tokenizer.json that says otherwise it is refused.
Whichever it is, the manifest records it (`do_lower_case`), and the training run's export writes it
into tokenizer_config.json, so transformers tokenizes as `prepare` did.

Accents follow the BertNormalizer rule for every tokenizer built from a vocabulary: stripped exactly when
lower-casing. A tokenizer.json decides its own (its normalizer as BertTokenizerFast rebuilds it); what it does
to "é" is what `prepare` did, and where that is not the rule (a cased model that strips accents, an uncased one
that keeps them) the manifest records it (`strip_accents`; format.OPTIONAL_MANIFEST_KEYS).
`tokenizer_options(manifest)` gives both, and `hf_tokenizer_files` writes both, so an export's tokenizer strips
accents exactly where `prepare` did.

A vocabulary's identity is its content: the tokens by id. `read_vocab` reads a vocab.txt (a BOM and CRLF line
ends are not part of a token), `vocab_content_sha256` digests the tokens as `prepare` writes them (so it
equals a dataset's vocab_checksum and the vocab_sha256 a checkpoint records), and `vocab_difference` says
in one line how two vocabularies differ (their sizes, the first id whose tokens differ). A dataset's
vocab.txt is checked against its own manifest whenever it is opened (`check_dataset_vocab`), and a tokenizer
directory whose tokenizer.json and vocab.txt disagree is refused (`load_tokenizer`).

The default vocabulary is trained with `tokenizers`' WordPiece trainer on the default corpus,
lower-cased, 8192 tokens: small enough for a tiny demonstration model, big enough that most words are
one or two pieces. Training is deterministic for a given corpus (checked by a test), so the same seed
gives the same bytes even though the vocabulary is rebuilt on every run.
"""

from __future__ import annotations

import hashlib
import io
import json
import itertools
import os
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np

from .. import jsonin
from ..errors import DataError
from ..fsutil import open_regular, sha256_file
from .format import SPECIAL_TOKENS, VOCAB
from .instance_files import ranges

DEFAULT_VOCAB_SIZE = 8192
LOWER_CASE_CHOICES = ("auto", "yes", "no")
_BRACKETED = re.compile(r"^\[[^\]]*\]$")


@dataclass
class TokenizerSpec:
    """Picklable description of a tokenizer, rebuilt in each worker process."""

    vocab: List[str]
    """Tokens by id."""
    do_lower_case: bool
    tokenizer_json: Optional[str] = None
    """Serialized Hugging Face tokenizer (tokenizer.json text) when one was given; else WordPiece over vocab."""
    source: str = "default"
    """Where the vocabulary came from (a path, or "default")."""
    strip_accents: Optional[bool] = None
    """Whether the tokenizer strips accents; None: exactly when lower-casing (BertNormalizer's rule, which
    every tokenizer built from a vocabulary follows). A tokenizer.json's own normalizer decides it."""
    tokenize_chinese_chars: bool = True
    """Whether CJK ideographs are split into words of one character (BertNormalizer's handle_chinese_chars,
    transformers' tokenize_chinese_chars)."""

    def __post_init__(self) -> None:
        index = {}
        for i, token in enumerate(self.vocab):
            if token in index:
                raise DataError("%s: token %r appears twice (lines %d and %d)"
                                % (self.source, token, index[token] + 1, i + 1))
            index[token] = i
        missing = [t for t in SPECIAL_TOKENS if t not in index]
        if missing:
            raise DataError("%s: vocabulary lacks the special token %s" % (self.source, missing[0]))
        if len(self.vocab) < len(SPECIAL_TOKENS) + 2:
            raise DataError("%s: vocabulary has only %d tokens" % (self.source, len(self.vocab)))

    @property
    def special_token_ids(self) -> Dict[str, int]:
        index = {t: i for i, t in enumerate(self.vocab)}
        return {t: index[t] for t in SPECIAL_TOKENS}

    @property
    def accents_stripped(self) -> bool:
        """Whether this tokenizer strips accents (strip_accents, else as it lower-cases)."""
        return bool(self.do_lower_case if self.strip_accents is None else self.strip_accents)

    def vocab_text(self) -> str:
        return vocab_text(self.vocab)

    def write_vocab(self, directory: str) -> Dict[str, object]:
        """Write ``directory``/vocab.txt; return the manifest's vocabulary fields (both `prepare` and `pack`
        describe their datasets with these). `strip_accents` is among them only where the tokenizer does not
        follow the rule (stripped exactly when lower-casing), so a manifest made from a vocabulary is as it was."""
        path = os.path.join(directory, VOCAB)
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(self.vocab_text())
        fields = {"vocab_file": VOCAB, "vocab_size": len(self.vocab), "vocab_checksum": sha256_file(path),
                  "do_lower_case": bool(self.do_lower_case), "special_token_ids": self.special_token_ids}
        if self.accents_stripped != bool(self.do_lower_case):
            fields["strip_accents"] = self.accents_stripped
        if not self.tokenize_chinese_chars:
            fields["tokenize_chinese_chars"] = False
        return fields

    def continuation_mask(self) -> np.ndarray:
        """(V,) bool: token is a word continuation ("##..."), for whole-word masking."""
        return np.array([t.startswith("##") for t in self.vocab], dtype=bool)

    def replacement_ids(self) -> np.ndarray:
        """Ids that the 10% random replacement may draw: every token except bracketed specials
        ([PAD], [CLS], [unused12], ...). The reference draws from the whole vocabulary; drawing [PAD]
        or [CLS] into the middle of a sentence teaches nothing, so they are left out."""
        return np.array([i for i, t in enumerate(self.vocab) if not _BRACKETED.match(t)], dtype=np.int32)

    def encoder(self) -> "BatchEncoder":
        """Batch encoder for this tokenizer (call in the process that uses it)."""
        return BatchEncoder(self)

    def build(self):
        """The fast tokenizer (call in the process that uses it)."""
        from tokenizers import Tokenizer
        from tokenizers.implementations import BertWordPieceTokenizer

        if self.tokenizer_json is not None:
            return Tokenizer.from_str(self.tokenizer_json)
        vocab = {t: i for i, t in enumerate(self.vocab)}
        return BertWordPieceTokenizer(vocab, lowercase=self.do_lower_case, strip_accents=self.strip_accents,
                                      handle_chinese_chars=self.tokenize_chinese_chars)._tokenizer


class BatchEncoder:
    """Sentences -> token ids, in large batches through the Rust tokenizer.

    For a WordPiece tokenizer built from a vocabulary (BertNormalizer: clean text, split CJK
    characters, strip accents, optionally lower-case; then BertPreTokenizer: split on whitespace,
    isolate punctuation), normalizing printable ASCII text is exactly `str.lower()` (or nothing, when
    cased): there is nothing to clean, split or strip. And pre-tokenizing it is exactly the regular
    expression `_ASCII_WORD` (runs of letters and digits; every other printable ASCII character but
    the space is punctuation, a word of its own). Such sentences (98% of the default corpus) are
    therefore split into words in Python, and only the *distinct* words (a few percent of all words)
    go through the tokenizer's WordPiece model, pre-tokenized; a sentence's ids are the
    concatenation of its words' ids, gathered with one vectorised index. Every other sentence goes
    through the full tokenizer. A Hugging Face tokenizer.json always goes through the full tokenizer
    (its normalizer and pre-tokenizer may be anything). A test checks the ids against the full
    tokenizer.
    """

    def __init__(self, spec: TokenizerSpec) -> None:
        from tokenizers import Tokenizer

        self.full = spec.build()
        self.plain = None
        self.lower = spec.do_lower_case
        if spec.tokenizer_json is None:
            self.plain = Tokenizer.from_str(self.full.to_str())
            self.plain.normalizer = None
        self._index = None  # word cache of _encode_words

    def __call__(self, sentences: List[str]) -> List[List[int]]:
        tokens, lengths = self.encode_flat(sentences)
        ends = np.cumsum(lengths)
        return [tokens[e - n:e].tolist() for e, n in zip(ends.tolist(), lengths.tolist())]

    def encode_flat(self, sentences: List[str]):
        """-> (tokens (T,) int32, lengths (n,) int64): the ids of all sentences back to back."""
        if self.plain is None:
            return _flatten([e.ids for e in self.full.encode_batch_fast(sentences, add_special_tokens=False)])
        easy = [s.isascii() and s.isprintable() for s in sentences]
        if all(easy):
            return self._encode_words(sentences)
        easy_index = [i for i, ok in enumerate(easy) if ok]
        hard_index = [i for i, ok in enumerate(easy) if not ok]
        hard_tokens, hard_lengths = _flatten([e.ids for e in self.full.encode_batch_fast(
            [sentences[i] for i in hard_index], add_special_tokens=False)])
        easy_tokens, easy_lengths = self._encode_words([sentences[i] for i in easy_index])
        lengths = np.zeros(len(sentences), dtype=np.int64)
        lengths[easy_index] = easy_lengths
        lengths[hard_index] = hard_lengths
        starts = np.cumsum(lengths) - lengths
        tokens = np.zeros(int(lengths.sum()), dtype=np.int32)
        tokens[ranges(starts[easy_index], easy_lengths)] = easy_tokens
        tokens[ranges(starts[hard_index], hard_lengths)] = hard_tokens
        return tokens, lengths

    def _encode_words(self, sentences: List[str]):
        """Printable-ASCII sentences -> (tokens, lengths), WordPiece run once per distinct word."""
        if not sentences:
            return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64)
        text = "\n".join(sentences)  # "\n" is not printable, so it only separates sentences
        words = _ASCII_WORD.findall(text.lower() if self.lower else text)
        if self._index is None or len(self._index) > _MAX_CACHED_WORDS:
            # Words seen by earlier calls (earlier shards of this worker) are not encoded again.
            self._index = {"\n": 0}  # word -> code; code 0 is the sentence separator, no tokens
            self._word_tokens, self._word_lengths = [np.zeros(0, dtype=np.int32)], [np.zeros(1, dtype=np.int64)]
        index = self._index
        fresh = sorted(set(words).difference(index))  # sorted: codes do not depend on string hashing
        if fresh:
            index.update(zip(fresh, range(len(index), len(index) + len(fresh))))
            encoded = self.plain.encode_batch_fast([[w] for w in fresh], is_pretokenized=True,
                                                   add_special_tokens=False)
            new_tokens, new_lengths = _flatten([e.ids for e in encoded])
            self._word_tokens = [np.concatenate(self._word_tokens + [new_tokens])]
            self._word_lengths = [np.concatenate(self._word_lengths + [new_lengths])]
        codes = np.fromiter(map(index.__getitem__, words), dtype=np.int64, count=len(words))  # (W,)
        word_tokens, word_lengths = self._word_tokens[0], self._word_lengths[0]
        word_starts = np.cumsum(word_lengths) - word_lengths
        tokens = word_tokens[ranges(word_starts[codes], word_lengths[codes])]
        sentence_of = np.cumsum(codes == 0)  # (W,) sentence index of every word
        lengths = np.bincount(sentence_of, weights=word_lengths[codes], minlength=len(sentences))
        return tokens, lengths.astype(np.int64)


_MAX_CACHED_WORDS = 1 << 20  # distinct words kept between calls (bounds the worker's memory)
# Pre-tokenization of printable ASCII (BertPreTokenizer), plus the "\n" that separates sentences.
_ASCII_WORD = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9 ]")


def _flatten(ids: List[List[int]]):
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    tokens = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum()))
    return tokens, lengths


def vocab_text(tokens: Sequence[str]) -> str:
    """A vocabulary as `prepare` writes vocab.txt: one token a line, each ended by "\\n"."""
    return "".join(t + "\n" for t in tokens)


def vocab_content_sha256(tokens: Sequence[str]) -> str:
    """sha256 of a vocabulary's content: of `vocab_text(tokens)` in UTF-8, so equal to the sha256 of the vocab.txt
    `prepare` writes (a dataset's vocab_checksum, a checkpoint's vocab_sha256) for the same tokens, whatever
    line ends or BOM another copy of the file has."""
    return hashlib.sha256(vocab_text(tokens).encode("utf-8")).hexdigest()


def read_vocab(path: str) -> List[str]:
    """The tokens of a vocab.txt by id (line number - 1): UTF-8, one non-empty token a line; a UTF-8 BOM and
    CRLF line ends are not part of a token. A FIFO or a device is refused (fsutil.open_regular). DataError
    naming the file (and line) otherwise."""
    return _read_vocab_file(path)


def _read_vocab_file(path: str) -> List[str]:
    try:
        f = open_regular(path, "rb", error=DataError)
    except OSError as error:
        raise DataError("%s: cannot read vocabulary (%s)" % (path, error.strerror))
    with f:
        data = f.read()
    try:  # the whole file at once (every dataset open reads it); line by line only to name a bad line
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and "\r" not in text:
        tokens = text.split("\n")
        if tokens and tokens[-1] == "" and text.endswith("\n"):
            tokens.pop()
        if tokens and tokens[0].startswith("\ufeff"):  # a UTF-8 BOM (Windows editors) is not token 0
            tokens[0] = tokens[0][1:]
        if tokens and all(t.strip() for t in tokens):
            return tokens
    tokens = []
    with io.BytesIO(data) as f:
        for number, raw in enumerate(f, 1):
            try:
                token = raw.decode("utf-8").rstrip("\r\n")
                if number == 1 and token.startswith("\ufeff"):  # a UTF-8 BOM (Windows editors) is not token 0
                    token = token[1:]
            except UnicodeDecodeError as error:
                raise DataError("%s:%d: not UTF-8 (byte 0x%02x)" % (path, number, raw[error.start]))
            if not token.strip():
                raise DataError("%s:%d: empty token" % (path, number))
            tokens.append(token)
    if not tokens:
        raise DataError("%s: empty vocabulary" % path)
    return tokens


def _guess_lower_case(vocab: List[str]) -> bool:
    return not any(ch.isupper() for t in vocab if not _BRACKETED.match(t) for ch in t)


def _json_lowercase(node) -> Optional[bool]:
    """Look for a Lowercase / BertNormalizer(lowercase=...) in a tokenizer.json normalizer."""
    if isinstance(node, dict):
        kind = node.get("type")
        if kind == "Lowercase":
            return True
        if kind == "BertNormalizer":
            return bool(node.get("lowercase", False))
        for value in node.values():
            found = _json_lowercase(value)
            if found:
                return True
    if isinstance(node, list):
        return any(_json_lowercase(v) for v in node)
    return None


def _check_tokenizer_config(path: str, config: Any) -> None:
    """tokenizer_config.json holds an object whose options this module reads are of the types transformers takes:
    do_lower_case and tokenize_chinese_chars true or false, strip_accents true, false or null (as it lower-cases).
    DataError naming the file and the key otherwise (a word such as "yes" would be taken for its truth value)."""
    if not isinstance(config, dict):
        raise DataError("%s: not a JSON object (got %s)" % (path, type(config).__name__))
    for key in ("do_lower_case", "tokenize_chinese_chars"):
        if key in config and not isinstance(config[key], bool):
            raise DataError("%s: %s should be true or false, got %s" % (path, key, json.dumps(config[key])))
    if config.get("strip_accents") is not None and not isinstance(config["strip_accents"], bool):
        raise DataError("%s: strip_accents should be true, false or null (as it lower-cases), got %s"
                        % (path, json.dumps(config["strip_accents"])))


def load_tokenizer(path: str, lower_case: str = "auto") -> TokenizerSpec:
    """A vocab.txt file or a Hugging Face tokenizer directory -> TokenizerSpec."""
    if lower_case not in LOWER_CASE_CHOICES:
        raise DataError("--lower-case must be one of %s" % "/".join(LOWER_CASE_CHOICES))
    forced = None if lower_case == "auto" else lower_case == "yes"
    if os.path.exists(path) and not os.path.isdir(path):  # a file (a FIFO or a device is refused in one line)
        vocab = _read_vocab_file(path)
        return TokenizerSpec(vocab, _guess_lower_case(vocab) if forced is None else forced, source=path)
    if not os.path.isdir(path):
        raise DataError("%s: no such vocabulary file or tokenizer directory" % path)
    config = {}
    config_path = os.path.join(path, "tokenizer_config.json")
    if os.path.lexists(config_path):
        try:
            config = jsonin.load_path(config_path, error=DataError)
        except (UnicodeDecodeError, ValueError) as error:
            raise DataError("%s: not valid JSON (%s)" % (config_path, str(error).splitlines()[0]))
        _check_tokenizer_config(config_path, config)
    json_path = os.path.join(path, "tokenizer.json")
    vocab_path = os.path.join(path, "vocab.txt")
    if os.path.lexists(json_path):
        with open_regular(json_path, "rb", error=DataError) as f:
            raw = f.read()
        try:
            text = raw.decode("utf-8")
            data = jsonin.loads(text)
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_str(text)
        except Exception as error:  # tokenizers raises its own exception types for a broken file
            raise DataError("%s: not a readable tokenizer (%s)" % (json_path, str(error).splitlines()[0]))
        by_id = tokenizer.get_vocab(with_added_tokens=True)
        own = [None] * len(by_id)  # type: List[Optional[str]]
        for token, i in by_id.items():
            if i >= len(own):
                raise DataError("%s: token ids are not contiguous" % json_path)
            own[i] = token
        if None in own:
            raise DataError("%s: token ids are not contiguous" % json_path)
        vocab = own  # type: ignore[assignment]
        if os.path.lexists(vocab_path):  # both: they must be one vocabulary, or the ids mean two things
            vocab = _read_vocab_file(vocab_path)
            difference = vocab_difference(vocab, own, "vocab.txt", "tokenizer.json")
            if difference:
                raise DataError("%s: tokenizer.json and vocab.txt disagree: %s (the ids prepare writes would mean "
                                "other tokens to one of them)" % (path, difference))
        rebuilt = _with_config_normalizer(data, config, text)  # a silent or absent config: transformers' defaults
        if rebuilt != text:
            text, tokenizer = rebuilt, Tokenizer.from_str(rebuilt)
        lower = _json_lowercase(jsonin.loads(text).get("normalizer"))
        if lower is None:
            lower = bool(config.get("do_lower_case", False))
        if forced is not None and forced != lower:
            raise DataError("--lower-case %s disagrees with %s, whose normalizer %s lower-case (leave out "
                            "--lower-case: a tokenizer.json decides its own casing)"
                            % (lower_case, json_path, "does" if lower else "does not"))
        return TokenizerSpec(vocab, lower, tokenizer_json=text, source=path, strip_accents=_strips_accents(tokenizer),
                             tokenize_chinese_chars=_splits_chinese(tokenizer))
    if os.path.lexists(vocab_path):
        vocab = _read_vocab_file(vocab_path)
        lower = config.get("do_lower_case", True) if forced is None else forced  # BertTokenizer's default: true
        strip = config.get("strip_accents")  # transformers' BertTokenizer reads it (null: as it lower-cases)
        chinese = config.get("tokenize_chinese_chars", True)  # and this (default true)
        return TokenizerSpec(vocab, bool(lower), source=path, strip_accents=strip if isinstance(strip, bool) else None,
                             tokenize_chinese_chars=chinese is not False)
    raise DataError("%s: directory holds neither tokenizer.json nor vocab.txt" % path)


def train_default_vocab(sentences: Sequence[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> TokenizerSpec:
    """The default vocabulary: lower-cased WordPiece trained on `sentences` (the default corpus)."""
    return train_vocab(lambda: iter(sentences), vocab_size, lower_case=True,
                       source="default (WordPiece trained on the default corpus, %d tokens)")


def train_vocab(sentences: Callable[[], Iterable[str]], vocab_size: int, lower_case: bool = True,
                source: str = "WordPiece, %d tokens") -> TokenizerSpec:
    """Train a WordPiece vocabulary of at most `vocab_size` tokens, deterministically for a given corpus.

    `sentences()` gives a fresh iterator over the corpus' sentences; it is read twice (the alphabet,
    then the training), so a corpus larger than memory streams. `source` is the TokenizerSpec's
    source, with %d for the vocabulary's size as trained (a small corpus gives fewer tokens).

    `tokenizers`' WordPiece trainer (BPE underneath) is not deterministic on its own
    (huggingface/tokenizers#1794): it gives the "##x" continuation tokens ids in hash-map order, and
    those ids break ties between merges of equal count. Registering every "##x" of the corpus'
    (normalized) alphabet up front, in sorted order, fixes their ids, which makes the result the same
    on every run; a test checks it.
    """
    from tokenizers.implementations import BertWordPieceTokenizer

    tokenizer = BertWordPieceTokenizer(lowercase=lower_case)
    normalizer = tokenizer._tokenizer.normalizer
    raw = set()
    for sentence in sentences():
        raw.update(sentence)
    alphabet = set(normalizer.normalize_str("\n".join(sorted(raw))))
    continuations = ["##" + ch for ch in sorted(ch for ch in alphabet if not ch.isspace())]
    tokenizer.train_from_iterator(sentences(), vocab_size=vocab_size, min_frequency=2, limit_alphabet=1000,
                                  special_tokens=list(SPECIAL_TOKENS) + continuations, show_progress=False)
    by_id = tokenizer.get_vocab()
    vocab = [""] * len(by_id)
    for token, i in by_id.items():
        vocab[i] = token
    return TokenizerSpec(vocab, lower_case, source=source % len(vocab))


HF_SPECIAL_TOKEN_NAMES = {"[PAD]": "pad_token", "[UNK]": "unk_token", "[CLS]": "cls_token", "[SEP]": "sep_token",
                          "[MASK]": "mask_token"}


def hf_tokenizer_files(do_lower_case: bool, model_max_length: int, strip_accents: Optional[bool] = None,
                       tokenize_chinese_chars: bool = True) -> Dict[str, dict]:
    """tokenizer_config.json and special_tokens_map.json of a transformers BertTokenizer (or its fast twin)
    that tokenizes as `TokenizerSpec.build()` does for a vocabulary: BertNormalizer (clean text, split
    CJK characters, strip accents when `strip_accents` (None: only when lower-casing), lower-case when
    `do_lower_case`), then BertPreTokenizer and "##" WordPiece. Without do_lower_case, transformers' default
    is True, which would lower-case text a cased model was trained on. Give both from the dataset's manifest
    (`tokenizer_options`): an uncased tokenizer.json that kept accents must not strip them in the export."""
    special = {HF_SPECIAL_TOKEN_NAMES[token]: token for token in SPECIAL_TOKENS}
    config = dict(special, tokenizer_class="BertTokenizer", do_lower_case=bool(do_lower_case),
                  do_basic_tokenize=True, tokenize_chinese_chars=bool(tokenize_chinese_chars),
                  strip_accents=None if strip_accents is None else bool(strip_accents),
                  model_max_length=int(model_max_length), clean_up_tokenization_spaces=True)
    return {"tokenizer_config.json": config, "special_tokens_map.json": special}


def write_export_tokenizer(directory: str, manifest: Mapping[str, Any], model_max_length: int) -> List[str]:
    """Beside an export's vocab.txt (DIRECTORY/vocab.txt, copied from the dataset): tokenizer_config.json and
    special_tokens_map.json of the tokenizer that made the dataset (`tokenizer_options(manifest)`: its casing
    and accents), each written atomically with the umask's mode. The export's vocab.txt is checked first: it
    must be the dataset's vocabulary by content (manifest field vocab_checksum, `check_dataset_vocab`).
    Returns the files written."""
    from ..fsutil import atomic_write_json

    path = os.path.join(directory, VOCAB)
    tokens = check_dataset_vocab(directory, dict(manifest, vocab_file=VOCAB))
    difference = vocab_digest_difference(tokens, manifest["vocab_checksum"], path,
                                         "the dataset's vocabulary (manifest field 'vocab_checksum')")
    if difference:
        raise DataError(difference)
    written = []
    for name, content in hf_tokenizer_files(model_max_length=model_max_length, **tokenizer_options(manifest)).items():
        atomic_write_json(os.path.join(directory, name), content)
        written.append(name)
    return written


def check_vocab_size(path: str, vocab_size: int, what: str = "the model", fewer_allowed: bool = False) -> List[str]:
    """The tokens of the vocab.txt at `path`, refused in one line unless there are `vocab_size` of them (the rows
    of `what`'s embedding): an export or a phase-1 directory whose vocabulary is not the model's. `fewer_allowed`:
    fewer tokens than rows are the model's own too (a model directory whose embeddings were padded past its
    tokenizer; tokenizer_fit), more are refused."""
    tokens = read_vocab(path)
    if fewer_allowed:
        tokenizer_fit(len(tokens), int(vocab_size), path)
        return tokens
    if len(tokens) != int(vocab_size):
        raise DataError("%s holds %d tokens, but %s has vocab_size %d (its embedding rows): not its vocabulary"
                        % (path, len(tokens), what, int(vocab_size)))
    return tokens


def tokenizer_fit(tokens: int, vocab_size: int, what: str) -> Optional[str]:
    """A tokenizer of ``tokens`` ids beside a model of ``vocab_size`` embedding rows (``what``, e.g. "--model DIR"):
    None where they are equal; one line saying so where the tokenizer is smaller (the last rows are never used: a
    model whose embeddings were padded, or another tokenizer); a DataError naming both sizes where it is larger (its
    last ids would have no row)."""
    if tokens > vocab_size:
        raise DataError("%s: its tokenizer has %d tokens, but the model's embeddings hold %d (config.json "
                        "vocab_size): ids %d .. %d have no embedding row"
                        % (what, tokens, vocab_size, vocab_size, tokens - 1))
    if tokens < vocab_size:
        return ("%s: its tokenizer has %d tokens, fewer than the model's %d embedding rows (config.json vocab_size): "
                "rows %d .. %d are never used" % (what, tokens, vocab_size, tokens, vocab_size - 1))
    return None


def tokenizer_options(manifest: Mapping[str, Any]) -> Dict[str, bool]:
    """{do_lower_case, strip_accents, tokenize_chinese_chars} of the tokenizer that made a dataset, from its
    manifest (strip_accents where recorded, else as it lower-cased; tokenize_chinese_chars where recorded, else
    true): the keyword arguments of `hf_tokenizer_files` besides model_max_length."""
    lower = bool(manifest["do_lower_case"])
    return {"do_lower_case": lower, "strip_accents": bool(manifest.get("strip_accents", lower)),
            "tokenize_chinese_chars": bool(manifest.get("tokenize_chinese_chars", True))}


def _with_config_normalizer(data: Dict[str, Any], config: Mapping[str, Any], text: str) -> str:
    """tokenizer.json's text with its BertNormalizer rebuilt from tokenizer_config.json, as transformers'
    BertTokenizerFast does: where the normalizer's lowercase, strip_accents or handle_chinese_chars differ from the
    config's do_lower_case, strip_accents or tokenize_chinese_chars (each with BertTokenizerFast's default where the
    config is silent: true, null, true), all three become the config's. Another normalizer is kept as it is."""
    normalizer = data.get("normalizer")
    if not isinstance(normalizer, dict) or normalizer.get("type") != "BertNormalizer":
        return text
    wanted = {"lowercase": config.get("do_lower_case", True), "strip_accents": config.get("strip_accents"),
              "handle_chinese_chars": config.get("tokenize_chinese_chars", True)}
    if all(normalizer.get(key, value) == value for key, value in wanted.items()):
        return text
    return json.dumps(dict(data, normalizer=dict(normalizer, **wanted)), ensure_ascii=False)


def _splits_chinese(tokenizer: Any) -> bool:
    """Whether a tokenizers.Tokenizer's normalizer puts spaces around a CJK ideograph (BertNormalizer's
    handle_chinese_chars)."""
    normalizer = tokenizer.normalizer
    return normalizer is not None and normalizer.normalize_str("\u4e2d\u6587") != "\u4e2d\u6587"


def _strips_accents(tokenizer: Any) -> bool:
    """Whether a tokenizers.Tokenizer's normalizer takes the accent off "é" and "À" (whatever its kind: a
    BertNormalizer, a Sequence with StripAccents, ...)."""
    normalizer = tokenizer.normalizer
    if normalizer is None:
        return False
    for text, bare in (("\u00e9", "e"), ("\u00c0", "a")):
        out = unicodedata.normalize("NFC", normalizer.normalize_str(text))
        if out.lower() != bare:
            return False
    return True


# ---------------------------------------------------------------------------------------------------
# a vocabulary's identity: its content


def _shown(token: str) -> str:
    text = repr(token)
    return text if len(text) <= 40 else text[:37] + "..."


def vocab_difference(a: Sequence[str], b: Sequence[str], a_name: str = "A", b_name: str = "B") -> Optional[str]:
    """None when two vocabularies hold the same tokens in the same order; else one line saying how they differ:
    their sizes where those differ, and the first id whose tokens differ, e.g.
    "vocab.txt has 30522 tokens, tokenizer.json 30523; first difference at id 1996: 'the' (vocab.txt) against
    'The' (tokenizer.json)". Compare a phase-1 directory's, a checkpoint's and a dataset's vocabulary with it
    (`read_vocab`, `vocab_of_directory`); where only a digest was recorded, `vocab_digest_difference`."""
    parts = []
    if len(a) != len(b):
        parts.append("%s has %d tokens, %s %d" % (a_name, len(a), b_name, len(b)))
    n = min(len(a), len(b))
    if n:
        left, right = np.asarray(list(a[:n]), dtype=object), np.asarray(list(b[:n]), dtype=object)
        differ = np.flatnonzero(left != right)
        if len(differ):
            i = int(differ[0])
            parts.append("first difference at id %d: %s (%s) against %s (%s)"
                         % (i, _shown(a[i]), a_name, _shown(b[i]), b_name))
    if not parts:
        return None
    if len(parts) == 1 and len(a) != len(b):
        parts.append("the first %d ids agree" % n)
    return "; ".join(parts)


def vocab_digest_difference(tokens: Sequence[str], recorded_sha256: str, name: str = "this vocabulary",
                            recorded: str = "the recorded one") -> Optional[str]:
    """None when `tokens` are the vocabulary whose content digest (`vocab_content_sha256`, a checkpoint's
    vocab_sha256, a dataset's vocab_checksum) is `recorded_sha256`; else one line naming both digests."""
    mine = vocab_content_sha256(tokens)
    if mine == recorded_sha256:
        return None
    return ("%s (%d tokens, content sha256 %s) is not %s (sha256 %s)"
            % (name, len(tokens), mine[:12], recorded, str(recorded_sha256)[:12]))


def vocab_of_directory(directory: str) -> List[str]:
    """The tokens of DIRECTORY/vocab.txt (a phase-1 model, an export, a dataset); DataError "<dir> has no
    vocab.txt: its vocabulary cannot be checked" where there is none."""
    path = os.path.join(directory, VOCAB)
    if not os.path.lexists(path):
        raise DataError("%s has no vocab.txt: its vocabulary cannot be checked" % directory)
    return read_vocab(path)


def vocab_path_difference(a: str, b: str) -> Optional[str]:
    """`vocab_difference` of two vocabularies named by path: a vocab.txt, or a directory holding one (refused in
    one line when it has none). Names each by its path."""
    tokens = [vocab_of_directory(p) if os.path.isdir(p) else read_vocab(p) for p in (a, b)]
    return vocab_difference(tokens[0], tokens[1], a, b)


def check_dataset_vocab(directory: str, manifest: Mapping[str, Any]) -> List[str]:
    """A dataset's vocab.txt against its own manifest, whenever the dataset is opened (data/shards.py): as many
    tokens as vocab_size, no token twice, and each special token at the id special_token_ids gives it (so
    [PAD], [UNK], [CLS], [SEP] and [MASK] are all there). Returns the tokens; DataError naming the file and
    the line otherwise."""
    path = os.path.join(directory, manifest["vocab_file"])
    tokens = read_vocab(path)
    if len(tokens) != manifest["vocab_size"]:
        raise DataError("%s: holds %d tokens, but manifest field 'vocab_size' says %d"
                        % (path, len(tokens), manifest["vocab_size"]))
    index = {}  # type: Dict[str, int]
    for i, token in enumerate(tokens):
        if token in index:
            raise DataError("%s:%d: token %s appears twice (lines %d and %d)"
                            % (path, i + 1, _shown(token), index[token] + 1, i + 1))
        index[token] = i
    for name in SPECIAL_TOKENS:
        i = manifest["special_token_ids"][name]
        if tokens[i] != name:
            where = "; %s is on line %d" % (name, index[name] + 1) if name in index else "; it has no %s" % name
            raise DataError("%s:%d: line %d is %s, but manifest field 'special_token_ids' gives %s id %d%s"
                            % (path, i + 1, i + 1, _shown(tokens[i]), name, i, where))
    return tokens
