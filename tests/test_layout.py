import importlib


def test_packages_import():
    for name in ("packing", "data", "model", "execution", "train"):
        mod = importlib.import_module("ipu_packing." + name)
        assert mod.__name__ == "ipu_packing." + name
