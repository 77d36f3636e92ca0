# The two commands in README are the contract: `make pretrain` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
OUT    := output

# `make pretrain`: the embedded default corpus prepared at S=128 (skipped when already there), then
# the demo config. `make bench`: packed vs padded throughput (BENCH_ARGS adds options).
DEMO_DATA  := $(OUT)/data/demo_128
DEMO_512   := $(OUT)/data/demo_512
BENCH_ARGS ?=

.PHONY: venv test pretrain bench compare clean

venv: $(STAMP)

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

$(DEMO_DATA)/packed/manifest.json: | $(STAMP)
	$(PY) -m ipu_packing.data prepare --input default --output $(DEMO_DATA) --max-seq-length 128 --max-sequences-per-pack 3

pretrain: $(STAMP) $(DEMO_DATA)/packed/manifest.json
	$(PY) run_pretraining.py --config demo

# `make compare`: demo_512 packed against demo_512_padded (same seed, same sequences per step and steps),
# then ipu_packing.compare on the two run directories (a finished run is reused, not retrained), then the
# interleaved throughput of the same config through the same runner (bench --config: both layouts see the
# same machine load, which two runs one after the other do not).
$(DEMO_512)/packed/manifest.json: | $(STAMP)
	$(PY) -m ipu_packing.data prepare --input default --output $(DEMO_512) --max-seq-length 512 --max-sequences-per-pack 3

compare: $(STAMP) $(DEMO_512)/packed/manifest.json
	$(PY) run_pretraining.py --config demo_512 logging.progress_bar=false
	$(PY) run_pretraining.py --config demo_512_padded logging.progress_bar=false
	$(PY) -m ipu_packing.compare $(OUT)/runs/demo_512 $(OUT)/runs/demo_512_padded --plot $(OUT)/compare/demo_512.png
	$(PY) -m ipu_packing.bench --config demo_512 --steps 10 --plot $(OUT)/compare/bench_demo_512.png

bench: $(STAMP)
	$(PY) -m ipu_packing.bench $(BENCH_ARGS)

clean:
	rm -rf $(OUT)

# `make test-ipu`: the `ipu`-marked tests on the IPU Model, with the Python of an activated Poplar SDK
# environment where Graphcore's poptorch wheel is installed (IPU_PYTHON=...); skipped where poptorch is absent.
IPU_PYTHON ?= python3

.PHONY: test-ipu
test-ipu:
	@$(IPU_PYTHON) -m pytest -q -rs -m ipu tests/test_execution_ipu.py; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "test-ipu: nothing ran: poptorch does not import with $(IPU_PYTHON)"; exit 1; fi; exit $$rc
