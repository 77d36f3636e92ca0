"""pyproject.toml's console scripts: each names a function that exists and runs its command through the
one error wrapper (a bad option is one `error:` line and exit 2); the configs install as data files that
the loader finds outside a checkout."""

from __future__ import annotations

import importlib
import os

import pytest

from app_fixtures import console_scripts as scripts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_user_facing_commands_have_console_scripts():
    assert sorted(scripts()) == sorted("ipu-packing-" + name for name in (
        "prepare", "pack", "inspect", "plan", "train", "finetune", "dry-run", "compare", "bench", "predict"))


@pytest.mark.parametrize("name", sorted(scripts()))
def test_each_console_script_reports_a_bad_option_in_one_line(name, capsys):
    module, function = scripts()[name].split(":")
    main = getattr(importlib.import_module(module), function)
    argv = ["--config", "demo", "--no-such-option"] if name == "ipu-packing-dry-run" else ["--no-such-option"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert "--no-such-option" in err or "the following arguments are required" in err, err


def test_installed_configs_are_found_under_sys_prefix(tmp_path, monkeypatch):
    import sys

    from ipu_packing.train import loader

    share = tmp_path / "share" / "ipu-packing" / "configs"
    share.mkdir(parents=True)
    (share / "demo.yaml").write_text("model: {}\n")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(loader.os.path, "isdir", lambda p: p == str(share))  # as if no checkout beside it
    assert loader._config_dir() == str(share)
