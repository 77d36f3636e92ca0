# The two commands in README are the contract: `make pretrain` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
OUT    := output

# `make pretrain`: the embedded default corpus prepared at S=128 (skipped when already there), then
# the demo config. `make bench`: packed vs padded throughput (BENCH_ARGS adds options).
DEMO_DATA  := $(OUT)/data/demo_128
BENCH_ARGS ?=

.PHONY: venv test pretrain bench clean

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

bench: $(STAMP)
	$(PY) -m ipu_packing.bench $(BENCH_ARGS)

clean:
	rm -rf $(OUT)
