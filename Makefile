# Two entry points that work on a fresh machine (Python 3.11, Java 17, pip):
#   make run   - set up .venv, then run the main job
#   make test  - set up .venv, then run the whole test suite (slow, Spark and load included)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup run test lint bench reliability clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m mqstore.workers.demo_run

test: $(STAMP)
	$(PY) -m pytest tests --ignore=tests/load
	@if [ -d tests/load ]; then $(PY) -m pytest -n 4 tests/load; fi

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) -m bench

# The reliability suites at full size (tests/RELIABILITY.md): 200 crash cycles, 50+
# power-loss cycles, 10 cases per corruption kind; figures in reliability.json.
reliability: $(STAMP)
	MQSTORE_RELIABILITY_FULL=1 MQSTORE_RELIABILITY_REPORT=reliability.json \
		$(PY) -m pytest tests/reliability -m reliability -n 2

clean:
	rm -rf $(VENV) data build *.egg-info
