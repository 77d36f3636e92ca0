"""Rule 7 (issue 24, part): every exception class a dependency raises on bad input reaches the one
wrapper as one line. The mechanism is ipu_packing/errors.py `describe_dependency_fault`, used by
`run_command`: the decoders' and parsers' own classes (gzip, zlib, zip, JSON, UTF-8, YAML, pickle,
safetensors, EOFError), a MemoryError (naming where it was asked for), and a RecursionError whose innermost
frame is a dependency's (input nested too deeply). A bug keeps its traceback: a RecursionError inside
ipu_packing's own code, a KeyError, a plain ValueError.

Tables: the wrapper fed each real dependency raising on real hostile bytes; the real commands fed hostile
files (deep JSON where a histogram, a manifest or an index is read; a TFRecord record of 2**40 bytes)."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import struct
import zlib

import numpy as np
import pytest

import app_fixtures as fx
from ipu_packing import errors
from ipu_packing.data.cli import main as data_main
from ipu_packing.errors import run_command
from ipu_packing.packing.cli import main as packing_main
from ipu_packing.train.cli import main as train_main

from app_fixtures import TINY

PACKAGE = os.path.dirname(os.path.abspath(errors.__file__))
DEEP = "[" * 100000 + "]" * 100000


def _safetensors_junk(tmp):
    from safetensors.torch import load_file

    path = os.path.join(str(tmp), "model.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", 1 << 40) + b"{junk")
    load_file(path)


def _safetensors_full_disk(tmp):
    """What safetensors raises when the disk fills during save_file (its Rust io::Error, as text)."""
    from safetensors import SafetensorError

    raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                          '"No space left on device" })')


def _h5py_junk(tmp):
    import h5py

    path = os.path.join(str(tmp), "x.hdf5")
    with open(path, "wb") as f:
        f.write(b"not an hdf5 file at all" * 10)
    h5py.File(path, "r")


def _npz_junk(tmp):
    path = os.path.join(str(tmp), "x.npz")
    with open(path, "wb") as f:
        f.write(b"PK\x03\x04" + b"\0" * 60)
    np.load(path)


def _yaml_deep(tmp):
    import yaml

    yaml.safe_load(DEEP)


def _yaml_bad(tmp):
    import yaml

    yaml.safe_load("a: [1, 2\nb: {")


FAULTS = [
    ("gzip-not-gzip", lambda t: gzip.decompress(b"not gzip data"), ["not a valid gzip file"]),
    ("gzip-truncated", lambda t: gzip.decompress(gzip.compress(b"x" * 1000)[:-12]), ["a file ended early"]),
    ("zlib", lambda t: zlib.decompress(b"\x78\x9cjunkjunk"), ["corrupt compressed data"]),
    ("npz-junk", _npz_junk, ["not a valid zip/.npz file"]),
    ("json-torn", lambda t: json.loads('{"a": [1, 2'), ["not valid JSON"]),
    ("json-deep", lambda t: json.loads(DEEP), ["nested too deeply", "decoder.py"]),
    ("utf8", lambda t: b"ok \xff\xfe".decode("utf-8"), ["not valid UTF-8 text", "0xff"]),
    ("yaml-bad", _yaml_bad, ["not valid YAML"]),
    ("yaml-deep", _yaml_deep, ["nested too deeply"]),
    ("pickle", lambda t: pickle.loads(b"\x80\x04junk"), ["not a readable pickle"]),
    ("safetensors-junk", _safetensors_junk, ["not a readable safetensors file"]),
    ("safetensors-disk-full", _safetensors_full_disk, ["no space left on device"]),
    ("h5py-junk", _h5py_junk, ["file signature not found"]),
    ("memory", lambda t: np.empty(1 << 43), ["out of memory"]),
    ("oserror-no-errno", lambda t: (_ for _ in ()).throw(OSError("Unable to open file (truncated)")),
     ["truncated"]),
]


@pytest.mark.parametrize("name, fault, words", FAULTS, ids=[c[0] for c in FAULTS])
def test_a_dependency_fault_is_one_line(name, fault, words, tmp_path, capsys):
    code = run_command(lambda argv: fault(tmp_path), [])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and len(err) < 600, err
    for word in words:
        assert word in err, (word, err)


def _own_recursion():
    """A recursive function whose frames are ipu_packing's own (compiled under its directory)."""
    namespace = {}
    exec(compile("def spin(n):\n    return spin(n + 1)\n", os.path.join(PACKAGE, "spin.py"), "exec"), namespace)
    return namespace["spin"](0)


BUGS = [
    ("own-recursion", _own_recursion, RecursionError),
    ("key-error", lambda: {}["missing"], KeyError),
    ("value-error", lambda: int("x"), ValueError),
    ("attribute-error", lambda: [].get("x"), AttributeError),
    ("type-error", lambda: len(3), TypeError),
]


@pytest.mark.parametrize("name, bug, kind", BUGS, ids=[c[0] for c in BUGS])
def test_a_bug_keeps_its_traceback(name, bug, kind):
    with pytest.raises(kind):
        run_command(lambda argv: bug(), [])


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    w = {"root": str(root), "data": fx.write_prepared(str(root / "prepared"), S=32, K=3, V=64, num_sequences=96)}
    (root / "deep.json").write_text(DEEP)
    (root / "deep_object.json").write_text('{"histogram": ' + DEEP + "}")
    deep_data = root / "deep_data"
    os.makedirs(str(deep_data))
    (deep_data / "manifest.json").write_text('{"a": ' + DEEP + "}")
    os.makedirs(str(deep_data / "packed"))
    (deep_data / "packed" / "manifest.json").write_text('{"a": ' + DEEP + "}")
    w["deep_data"] = str(deep_data)
    from synthetic_corpus import make_inputs
    from ipu_packing.data.existing.tfrecord import masked_crc

    w["corpus"], w["vocab"] = make_inputs(str(root))
    header = struct.pack("<Q", 1 << 40)
    with open(str(root / "huge.tfrecord"), "wb") as f:
        f.write(header + struct.pack("<I", masked_crc(header)) + b"\0" * 64)
    return w


COMMANDS = [
    ("packing-deep-histogram", packing_main, lambda w: ["--histogram", os.path.join(w["root"], "deep.json")],
     ["nested too deeply"]),
    ("packing-deep-histogram-object", packing_main,
     lambda w: ["--histogram", os.path.join(w["root"], "deep_object.json")], ["nested too deeply"]),
    ("train-deep-manifest", train_main,
     lambda w: ["--config", "demo"] + TINY + ["data.dir=%s" % w["deep_data"],
                                             "checkpoint.output_dir=%s" % os.path.join(w["root"], "run")],
     ["nested too deeply"]),
    ("inspect-deep-manifest", data_main, lambda w: ["inspect", w["deep_data"]], ["nested too deeply"]),
    ("pack-tfrecord-2**40", data_main,
     lambda w: ["pack", "--input", os.path.join(w["root"], "huge.tfrecord"), "--vocab", w["vocab"], "--output",
                os.path.join(w["root"], "out_huge"), "--workers", "1", "--quiet"],
     ["huge.tfrecord: record 0", "1099511627776 bytes, more than"]),  # checked against the file's size first
]


@pytest.mark.parametrize("name, main, argv, words", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_hostile_file_through_a_command_is_one_line(name, main, argv, words, ws, capsys):
    code = main(argv(ws))
    out, err = capsys.readouterr()
    assert code == 2, (out[-300:], err[-600:])
    assert err.startswith("error: ") and err.count("\n") == 1 and len(err) < 600, err
    for word in words:
        assert word in err, (word, err)
