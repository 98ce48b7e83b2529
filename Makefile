# Temper: `make demo` and `make test` set everything up themselves.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.temper-setup
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo test test-fast lint format bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt scripts/setup.sh apt-packages.txt
	bash scripts/setup.sh
	@touch $(STAMP)

demo: setup
	$(VENV)/bin/temper train --run.overwrite=true

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks scripts
	$(VENV)/bin/ruff format --check src tests benchmarks scripts

format: setup
	$(VENV)/bin/ruff format src tests benchmarks scripts
	$(VENV)/bin/ruff check --fix src tests benchmarks scripts

bench: setup
	$(PY) -m pip install -q -c constraints.txt -e ".[bench]"
	$(PY) benchmarks/engine_vs_hf.py
	$(PY) benchmarks/grpo_vs_trl.py
	$(PY) benchmarks/sandbox.py
	$(PY) benchmarks/eval_parallel.py
	$(PY) benchmarks/async_vs_sync.py
	$(PY) benchmarks/weight_sync.py
	$(PY) benchmarks/rm_server.py

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
