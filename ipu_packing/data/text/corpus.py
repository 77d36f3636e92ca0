"""Text in: files, directories, globs, or the embedded default corpus -> documents of sentences.

A *document* is a list of sentences (str). Everything downstream works on documents, like the
reference recipe: NSP takes its "next" segment from the same document, and its random segment from
another one.

Two input formats are read:

* BERT format: one sentence per line, a blank line between documents (what
  google-research/bert create_pretraining_data.py reads).
* Plain text: paragraphs separated by a blank line, documents separated by two or more blank lines
  (or by the end of a file). The lines of a paragraph are joined and split into sentences at
  sentence-final punctuation followed by whitespace and an upper-case letter, digit, quote or bracket.
  That splitter is deliberately simple: NSP only needs roughly sentence-sized units, and a rule this
  simple is fast and gives the same answer everywhere.

`--format auto` decides per file from its first lines: it is BERT format when most non-blank lines are
followed by another non-blank line (sentences packed line after line) and most of those end with
sentence punctuation; wrapped prose fails the second test, one-paragraph-per-line text the first.

Files are read as bytes and decoded line by line, so a bad byte is reported with its file and line
number. Memory stays bounded whatever the input: a line longer than MAX_LINE_BYTES is read in pieces
of that size (each piece a sentence: no real sentence is that long), and a document or paragraph
that grows past MAX_DOCUMENT_CHARS without a blank line ends there and the next one begins (an
endless stream without blank lines becomes many documents, never one held in memory). Only regular
files are read: a device, a FIFO or a socket (/dev/zero, a pipe) is refused.

The embedded default corpus is built from text every CPython ships: the pydoc topics
(`pydoc_data.topics`, one document per topic) and the docstrings of the standard library's modules
(one document per module file, read from the source so that nothing is imported). Files
are visited in sorted order, so the corpus is the same on every run of the same Python version; its
sha256 goes into the manifest.
"""

from __future__ import annotations

import inspect
import glob
import hashlib
import os
import re
import sysconfig
from dataclasses import dataclass
from typing import Iterable, Iterator, List, Optional, Tuple

from ...errors import DataError
from ...fsutil import open_regular

Document = List[str]

FORMATS = ("auto", "bert", "text")

MAX_LINE_BYTES = 1 << 20
"""A longer line is read as pieces of this many bytes (cut at a UTF-8 character boundary)."""
MAX_DOCUMENT_CHARS = 1 << 22
"""A document (or a paragraph of plain text) ends when it reaches this many characters."""

_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+(?=[A-Z0-9\"'(\[])")
_TERMINAL = (".", "!", "?", '"', "'", ")")


def split_sentences(paragraph: str) -> List[str]:
    """Split one paragraph (already joined into one line) into sentences."""
    return [s.strip() for s in _SENTENCE_END.split(paragraph) if s.strip()]


def _regular(path: str) -> str:
    if os.path.exists(path) and not os.path.isfile(path):
        raise DataError("%s: not a regular file (devices, pipes and sockets are not read)" % path)
    return path


def resolve_inputs(spec: str) -> List[str]:
    """A file, a directory (every file below it, sorted) or a glob -> sorted file list; anything but
    a regular file among them is refused."""
    if os.path.isdir(spec):
        files = []
        for root, dirs, names in os.walk(spec):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            files.extend(_regular(os.path.join(root, n)) for n in sorted(names) if not n.startswith("."))
        if not files:
            raise DataError("%s: directory holds no files" % spec)
        return files
    if os.path.exists(spec):
        return [_regular(spec)]
    if any(ch in spec for ch in "*?["):
        files = sorted(_regular(p) for p in glob.glob(spec, recursive=True) if not os.path.isdir(p))
        if not files:
            raise DataError("%s: the glob matches no files" % spec)
        return files
    raise DataError("%s: no such file or directory" % spec)


def _lines(path: str) -> Iterator[str]:
    """Decoded lines of a file without their line ends; bad UTF-8 -> DataError naming file and line."""
    try:
        f = open_regular(path, "rb", error=DataError)
    except OSError as error:
        raise DataError("%s: cannot read (%s)" % (path, error.strerror))
    with f:
        number, column, carry = 1, 0, b""
        while True:
            raw = carry + f.readline(MAX_LINE_BYTES - len(carry))
            if not raw:
                return
            carry = b""
            whole = raw.endswith(b"\n") or len(raw) < MAX_LINE_BYTES
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                if not whole and error.reason == "unexpected end of data":  # a character cut by the piece
                    raw, carry = raw[:error.start], raw[error.start:]
                    line = raw.decode("utf-8")  # the cut was the first bad byte, so this decodes
                else:
                    raise DataError("%s:%d: not UTF-8 (byte 0x%02x at column %d)"
                                    % (path, number, raw[error.start], column + error.start + 1))
            if whole:
                number, column = number + 1, 0
            else:
                column += len(raw)
            yield line.rstrip("\r\n")


def detect_format(path: str, sample_lines: int = 400) -> str:
    lines = []
    for line in _lines(path):
        lines.append(line.strip())
        if len(lines) >= sample_lines:
            break
    nonblank = [i for i, line in enumerate(lines) if line]
    if not nonblank:
        return "bert"
    followed = [i for i in nonblank if i + 1 < len(lines) and lines[i + 1]]
    terminal = [i for i in followed if lines[i].endswith(_TERMINAL)]
    if len(followed) >= 0.5 * len(nonblank) and len(terminal) >= 0.6 * max(1, len(followed)):
        return "bert"
    return "text"


def read_documents(path: str, fmt: str) -> Iterator[Document]:
    """Documents of one file, in file order; empty documents are skipped."""
    if fmt == "auto":
        fmt = detect_format(path)
    document: Document = []
    paragraph: List[str] = []
    blanks = 0
    chars = 0  # in document and paragraph
    for line in _lines(path):
        line = line.strip()
        if chars >= MAX_DOCUMENT_CHARS:  # bounded memory: a document ends here (see the module notes)
            if paragraph:
                document.extend(split_sentences(" ".join(paragraph)))
                paragraph = []
            if document:
                yield document
                document = []
            chars = 0
        chars += len(line)
        if fmt == "bert":
            if line:
                document.append(line)
            elif document:
                yield document
                document, chars = [], 0
            continue
        if line:
            if blanks >= 2 and document:
                yield document
                document, chars = [], len(line)
            blanks = 0
            paragraph.append(line)
            continue
        blanks += 1
        if paragraph:
            document.extend(split_sentences(" ".join(paragraph)))
            paragraph = []
    if paragraph:
        document.extend(split_sentences(" ".join(paragraph)))
    if document:
        yield document


# ---------------------------------------------------------------------------------------------------
# embedded default corpus

_SKIP_DIRS = {"test", "tests", "site-packages", "dist-packages", "idlelib", "lib2to3", "turtledemo",
              "ensurepip", "__pycache__", "tkinter", "venv"}


def _prose_paragraphs(text: str) -> List[str]:
    """Paragraphs of a docstring or pydoc topic, without doctest and code lines."""
    paragraphs, current = [], []
    for line in text.splitlines():
        stripped = line.strip()
        code = stripped.startswith((">>>", "...", "$ ")) or line.startswith(("    ", "\t"))
        if not stripped or code:
            if current:
                paragraphs.append(" ".join(current))
                current = []
            continue
        current.append(stripped)
    if current:
        paragraphs.append(" ".join(current))
    return paragraphs


def _document(text_blocks: Iterable[str]) -> Document:
    sentences: Document = []
    for block in text_blocks:
        for paragraph in _prose_paragraphs(block):
            sentences.extend(split_sentences(paragraph))
    return sentences


def stdlib_files() -> List[str]:
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for directory, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith((".", "config-")))
        files.extend(os.path.join(directory, n) for n in sorted(names) if n.endswith(".py"))
    return files


# Every triple-quoted string literal, in order, so that one string's closing quotes are never taken
# for the next one's opening. A literal is prose to keep when only blanks and a string prefix stand
# before it on its line (a docstring, or another bare string statement); prefixes with b (bytes) are
# not prose. (One expression with an optional line-start group would do the same, slower: it cannot
# jump to the next quotes.)
_TRIPLE_QUOTED = re.compile(r"(\"\"\"|\'\'\')(.*?)\1", re.DOTALL)
_LEAD = re.compile(r"[ \t]*([rRbBuU]{0,2})")


def _module_docstrings(path: str) -> List[str]:
    """The docstrings (and other bare string statements) of one source file, in file order.

    Found with a regular expression over the source instead of `ast`: parsing the ~10 MB of the
    standard library takes seconds, the expression a fraction of that, for the same prose.
    """
    try:
        with open(path, "rb") as f:
            source = f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    docs = []
    for match in _TRIPLE_QUOTED.finditer(source):
        start = match.start()
        lead = _LEAD.fullmatch(source, source.rfind("\n", 0, start) + 1, start)
        if lead is None or "b" in lead.group(1).lower():
            continue
        doc = inspect.cleandoc(match.group(2))
        if doc:
            docs.append(doc)
    return docs


def stdlib_documents() -> Iterator[Tuple[str, Document]]:
    """(module, document) of each standard-library file with prose, in the default corpus' order: the module is
    the file's top-level name ("email" for email/mime/text.py, "smtplib" for smtplib.py). The demo task
    (data/finetune/demo.py) labels sentences by it."""
    root = sysconfig.get_paths()["stdlib"]
    for path in stdlib_files():
        document = _document(_module_docstrings(path))
        if document:
            top = os.path.relpath(path, root).split(os.sep)[0]
            yield (top[:-3] if top.endswith(".py") else top), document


def default_documents() -> Iterator[Document]:
    """The embedded corpus: pydoc topics, then standard-library docstrings (about 2 MB of prose)."""
    from pydoc_data.topics import topics

    for name in sorted(topics):
        document = _document([topics[name]])
        if document:
            yield document
    for _, document in stdlib_documents():
        yield document


# ---------------------------------------------------------------------------------------------------
# corpus -> shards of documents


@dataclass
class CorpusSpec:
    """Where the text comes from."""

    input: str
    """A file, a directory, a glob, or "default" for the embedded corpus."""
    format: str = "auto"
    """"auto", "bert" (sentence per line, blank line between documents) or "text" (plain prose)."""

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise DataError("--format must be one of %s, got %r" % ("/".join(FORMATS), self.format))

    @property
    def is_default(self) -> bool:
        return self.input == "default"

    def files(self) -> List[str]:
        return [] if self.is_default else resolve_inputs(self.input)

    def documents(self) -> Iterator[Document]:
        if self.is_default:
            yield from default_documents()
            return
        for path in self.files():
            yield from read_documents(path, self.format)


class CorpusDigest:
    """Running sha256 of the documents as read (sentences joined by newlines)."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self.num_documents = 0
        self.num_sentences = 0
        self.num_chars = 0

    def add(self, document: Document) -> None:
        text = "\n".join(document) + "\n\n"
        self._digest.update(text.encode("utf-8"))
        self.num_documents += 1
        self.num_sentences += len(document)
        self.num_chars += len(text)

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def shard_documents(documents: Iterable[Document], shard_chars: int,
                    digest: Optional[CorpusDigest] = None) -> Iterator[List[Document]]:
    """Group documents, in order, into shards of at least `shard_chars` characters.

    The grouping depends on the text only (never on the number of workers), so every shard, and the
    RNG derived from its index, is the same however many processes build them.
    """
    shard: List[Document] = []
    chars = 0
    for document in documents:
        if digest is not None:
            digest.add(document)
        shard.append(document)
        chars += sum(len(s) + 1 for s in document)
        if chars >= shard_chars:
            yield shard
            shard, chars = [], 0
    if shard:
        yield shard
