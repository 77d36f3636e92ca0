# The two commands in README are the contract: `make pretrain` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
OUT    := output

# `make pretrain`: the embedded default corpus prepared at S=128 (skipped when already there), then
# the demo config. `make bench`: packed vs padded throughput (BENCH_DATA: the lengths, BENCH_ARGS adds options).
DEMO_DATA  := $(OUT)/data/demo_128
DEMO_512   := $(OUT)/data/demo_512
BENCH_ARGS ?=

.PHONY: venv test test-fast lint pretrain finetune bench compare gpu-check clean

venv: $(STAMP)

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $(STAMP)

# `make test`: every test, on both cores. The tests not marked serial run on 2 pytest-xdist workers while those
# marked serial run beside them in one process (their output is held in a file and printed after): each serial test
# starts several processes itself (gloo/torchrun pairs, PopRun stand-in instances, forkserver probes, worker pools)
# and spends much of its time waiting on them, so a third process on the two cores fills the time the xdist pass
# leaves idle; none of them depends on the machine being quiet (pytest.ini). Both passes run; the target fails when
# either did, with that pass's status. The serial pass collects only the modules that write "pytest.mark.serial"
# (SERIAL_MODULES; tests/conftest.py refuses a serial test elsewhere).
SERIAL_MODULES = $(shell grep -l "pytest.mark.serial" tests/test_*.py)
test: $(STAMP)
	@log=$$(mktemp); trap 'rm -f "$$log"' EXIT; \
	$(PY) -m pytest -q -p no:cacheprovider -m serial $(SERIAL_MODULES) >"$$log" 2>&1 & pid=$$!; \
	$(PY) -m pytest -q -n 2 -m "not serial"; parallel=$$?; \
	wait $$pid; serial=$$?; echo "--- the serial tests, run beside the others:"; cat "$$log"; \
	if [ $$parallel -ne 0 ]; then exit $$parallel; fi; exit $$serial

# `make test-fast`: a developer's loop, the tests not marked slow (@pytest.mark.slow, from measured durations),
# on 2 workers.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n 2

# `make lint`: ruff with the settings in pyproject.toml ([tool.ruff]); .ci/run runs it before `make test`.
lint: $(STAMP)
	$(PY) -m ruff check .

$(DEMO_DATA)/packed/manifest.json: | $(STAMP)
	$(PY) -m ipu_packing.data prepare --input default --output $(DEMO_DATA) --max-seq-length 128 --max-sequences-per-pack 3

pretrain: $(STAMP) $(DEMO_DATA)/packed/manifest.json
	$(PY) run_pretraining.py --config demo

# `make compare`: demo_512 packed against demo_512_padded (same seed, same sequences per step and steps),
# then ipu_packing.compare on the two run directories (a finished run is reused, not retrained), then the
# interleaved throughput of the same config through the same runner (bench --config: both layouts see the
# same machine load, which two runs one after the other do not).
# Both runs train with the configs' attention, `auto` (varlen at S=512 on CPU: train/model_section.py).
# `make compare ATTENTION=dense` (or sdpa, varlen): the packed run trains with model.packed_attention=$(ATTENTION)
# into output/runs/demo_512_$(ATTENTION), against the same padded run (auto); bench --config then runs both
# layouts with that attention.
ATTENTION ?= auto
ifeq ($(ATTENTION),auto)
COMPARE_NAME := demo_512
COMPARE_ARGS :=
else
COMPARE_NAME := demo_512_$(ATTENTION)
COMPARE_ARGS := model.packed_attention=$(ATTENTION) checkpoint.output_dir=$(OUT)/runs/$(COMPARE_NAME)
BENCH_ATTENTION := model.packed_attention=$(ATTENTION)
endif

$(DEMO_512)/packed/manifest.json: | $(STAMP)
	$(PY) -m ipu_packing.data prepare --input default --output $(DEMO_512) --max-seq-length 512 --max-sequences-per-pack 3

compare: $(STAMP) $(DEMO_512)/packed/manifest.json
	$(PY) run_pretraining.py --config demo_512 logging.progress_bar=false $(COMPARE_ARGS)
	$(PY) run_pretraining.py --config demo_512_padded logging.progress_bar=false
	$(PY) -m ipu_packing.compare $(OUT)/runs/$(COMPARE_NAME) $(OUT)/runs/demo_512_padded --plot $(OUT)/compare/$(COMPARE_NAME).png
	$(PY) -m ipu_packing.bench --config demo_512 $(BENCH_ATTENTION) --steps 10 --plot $(OUT)/compare/bench_$(COMPARE_NAME).png

# `make finetune`: the pretraining demo's export (output/runs/demo/final, trained first when absent), fine-tuned on
# the embedded demo classification task (docs/data.md: standard-library sentences labelled by their family of
# modules), packed, evaluated per example on its validation split; then `predict` on the held-out test inputs,
# and the packed and padded fine-tuning speeds of the same examples through the same runner, interleaved.
FT_DATA    := $(OUT)/data/finetune_demo
FT_TEXT    := $(OUT)/data/finetune_demo_text
DEMO_FINAL := $(OUT)/runs/demo/final

$(DEMO_FINAL)/config.json: | $(STAMP) $(DEMO_DATA)/packed/manifest.json
	$(PY) run_pretraining.py --config demo logging.progress_bar=false

$(FT_DATA)/train/packed/manifest.json: | $(DEMO_FINAL)/config.json
	$(PY) -m ipu_packing.data prepare --task classification --input default --tokenizer $(DEMO_FINAL) --output $(FT_DATA) --max-seq-length 128 --max-sequences-per-pack 8

$(FT_TEXT)/test.tsv: | $(STAMP)
	$(PY) -c "from ipu_packing.data.finetune.demo import write_demo_task; write_demo_task('$(FT_TEXT)')"

finetune: $(STAMP) $(FT_DATA)/train/packed/manifest.json $(FT_TEXT)/test.tsv
	$(PY) run_finetuning.py --config finetune_demo logging.progress_bar=false
	$(PY) -m ipu_packing.predict --model $(OUT)/runs/finetune_demo/final --input $(FT_TEXT)/test.tsv --output $(OUT)/predictions/finetune_demo_test.jsonl
	$(PY) -m ipu_packing.bench --config finetune_demo --steps 20

# `make bench`: the synthetic bench (bench/throughput.py: training steps of random tokens, packed and one a row,
# interleaved) on the lengths of the embedded default corpus at S=512 (output/data/demo_512, prepared first when
# absent), with the shipped attention default; BENCH_ARGS adds options (e.g. --json). BENCH_DATA="--histogram
# ../shared/data/wikipedia_512_histogram.json" times Wikipedia's lengths instead, the histogram the paper published
# (in graphcore/examples, folder tutorials/blogs_code/packedBERT; docs/usage.md, Data beside the checkout).
BENCH_DATA ?= --data $(DEMO_512)

bench: $(STAMP) $(DEMO_512)/packed/manifest.json
	$(PY) -m ipu_packing.bench $(BENCH_DATA) $(BENCH_ARGS)

# `make gpu-check`: the one prepared command for the day a GPU is lent, 5 1/2 minutes on one H200
# (ipu_packing/bench/gpu_check.py says what it records; docs/results.md its figures): demo_512_cuda trained with
# each attention under bf16, a run with deterministic kernels SIGKILLed after its first checkpoint, resumed and
# compared bitwise, and the peers bench (ours against transformers) at BERT-Base and Large, S=512; prepares
# output/data/demo_512 first when absent. The report:
# output/gpu_check/gpu_check.json and gpu_check.md. `make gpu-check GPU_CHECK_ARGS="--cpu --output DIR"`: the
# CPU mode, tiny sizes, about a minute. It needs a CUDA build of torch in the venv (docs/usage.md, Training on CUDA).
GPU_CHECK_ARGS ?=

gpu-check: $(STAMP)
	$(PY) -m ipu_packing.bench.gpu_check $(GPU_CHECK_ARGS)

clean:
	rm -rf $(OUT)

# `make test-ipu`: the `ipu`-marked tests on the IPU Model, with the Python of an activated Poplar SDK
# environment where Graphcore's poptorch wheel is installed (IPU_PYTHON=...); skipped where poptorch is absent.
IPU_PYTHON ?= python3

.PHONY: test-ipu
test-ipu:
	@$(IPU_PYTHON) -m pytest -q -rs -m ipu tests/test_execution_ipu.py; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "test-ipu: nothing ran: poptorch does not import with $(IPU_PYTHON)"; exit 1; fi; exit $$rc

# `make test-sdk`: the whole suite, in one process, on the Poplar SDK's Python stack: Python 3.8, torch 2.0.1
# (PyPI's, where the SDK's is absent) and requirements-sdk.txt; poptorch itself only comes with the SDK, so its
# tests run against the stand-ins. PYTHON38 is a Python 3.8 (by default pyenv's 3.8 where pyenv has one, else
# python3.8; pyenv's shim for python3.8 does not run while another version is selected).
PYTHON38 ?= $(shell p=$$(pyenv prefix 3.8 2>/dev/null) && echo "$$p/bin/python" || echo python3.8)
SDK_VENV := .venv-sdk
SDK_STAMP := $(SDK_VENV)/.installed

$(SDK_STAMP): requirements-sdk.txt
	$(PYTHON38) -c 'import sys; assert sys.version_info[:2] == (3, 8), sys.version' || \
		{ echo "test-sdk: PYTHON38=$(PYTHON38) is not a Python 3.8"; exit 1; }
	$(PYTHON38) -m venv $(SDK_VENV)
	$(SDK_VENV)/bin/python -m pip install -q --upgrade pip
	$(SDK_VENV)/bin/python -m pip install -q torch==2.0.1 -r requirements-sdk.txt
	touch $(SDK_STAMP)

.PHONY: test-sdk
test-sdk: $(SDK_STAMP)
	$(SDK_VENV)/bin/python -m pytest -q -rs -p no:cacheprovider
