# The two commands in README are the contract: `make pretrain` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
OUT    := output

.PHONY: venv test pretrain bench clean

venv: $(STAMP)

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(OUT)
