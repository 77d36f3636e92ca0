"""ipu_packing/jsonin.py: nesting is measured before json parses, so no reader meets a RecursionError."""

from __future__ import annotations

import json

import pytest

from ipu_packing import jsonin


@pytest.mark.parametrize("text, value", [
    ('{"a": [1, 2, {"b": "[[[[[[[["}]}', {"a": [1, 2, {"b": "[[[[[[[["}]}),  # brackets in a string
    ('["\\"[[[[", 1]', ['"[[[[', 1]),  # an escaped quote does not end the string
    ("[" * 64 + "]" * 64, eval("[" * 64 + "]" * 64)),  # exactly the limit
    (b'{"x": 1}', {"x": 1}),  # bytes are UTF-8
])
def test_what_json_reads_within_the_limit(text, value):
    assert jsonin.loads(text) == value


@pytest.mark.parametrize("text, at", [
    ("[" * 65 + "]" * 65, 64),
    ('{"a": ' * 65 + "1" + "}" * 65, 6 * 64),
    ("[" * 1000000, 64),  # a megabyte of brackets: refused without parsing it
    ('["]]]]"' + ", [" * 70, 6 + 3 * 64),
])
def test_deeper_than_the_limit_is_a_json_error_at_its_place(text, at):
    with pytest.raises(json.JSONDecodeError) as info:
        jsonin.loads(text)
    assert isinstance(info.value, jsonin.TooDeep) and info.value.pos == at
    assert str(info.value).startswith("nested too deeply: more than 64 levels of arrays and objects")


def test_a_lower_limit_is_the_callers_choice():
    assert jsonin.loads("[[[1]]]", max_depth=3) == [[[1]]]
    with pytest.raises(jsonin.TooDeep):
        jsonin.loads("[[[[1]]]]", max_depth=3)


def test_a_json_file_larger_than_the_bound_is_refused_without_reading_it_whole(tmp_path):
    from ipu_packing.errors import InputError

    path = tmp_path / "config.json"
    path.write_bytes(b'{"pad": "' + b" " * 2000 + b'"}')
    assert jsonin.load_path(str(path), max_bytes=4096) == {"pad": " " * 2000}
    with pytest.raises(InputError, match="config.json: larger than 1024 bytes"):
        jsonin.load_path(str(path), max_bytes=1024)


BREAKS = ["\u2028", "\u2029", "\u0085", "\x1c", "\x1d", "\x1e", "\x0b", "\x0c"]
"""Characters str.splitlines breaks a line at, besides \\n and \\r."""


@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_json_lines_are_cut_at_newlines_only(ensure_ascii):
    from ipu_packing.jsonout import jsonl_text

    records = [{"context": "a%sb" % ch, "n": i} for i, ch in enumerate(BREAKS)] + [{"context": "crlf", "n": -1}]
    text = jsonl_text(records, ensure_ascii=ensure_ascii).replace('"n": -1}\n', '"n": -1}\r\n') + "\n\n"
    assert [jsonin.loads(line) for _, line in jsonin.jsonl_lines(text)] == records
    assert [n for n, _ in jsonin.jsonl_lines(text)] == list(range(1, len(records) + 1))
