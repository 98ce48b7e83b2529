# Temper: `make demo` and `make test` set everything up themselves.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.temper-setup
# vLLM's CPU build pins transformers < 5.20: its tests run in a second environment.
VLLM_PY    := .venv-vllm/bin/python
VLLM_STAMP := .venv-vllm/.temper-setup
# In .venv-vllm: the vLLM tests, and the trainer and engine tests on vLLM's transformers
# (the lower end of the range pyproject declares).
VLLM_TESTS := tests/engine/test_vllm_engine.py tests/orchestrator/test_vllm_runs.py \
	tests/rollout/test_multi_turn.py tests/trainer/test_policy_trainer.py \
	tests/trainer/test_batching.py tests/engine/test_native_engine.py tests/engine/test_hf_engine.py \
	tests/vision/test_vlm_vllm.py tests/vision/test_vlm_rollouts.py tests/models/test_tiny_vlm_vllm.py \
	tests/serve/test_vllm_structured.py
export TOKENIZERS_PARALLELISM := false

.PHONY: setup setup-vllm demo test test-vllm test-fast lint format bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt scripts/setup.sh apt-packages.txt
	bash scripts/setup.sh
	@touch $(STAMP)

setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml constraints.txt scripts/setup.sh apt-packages.txt
	bash scripts/setup.sh --vllm
	@touch $(VLLM_STAMP)

demo: setup
	$(VENV)/bin/temper train --run.overwrite=true

# The vLLM suite runs alongside the main one: the main suite leaves about a third of
# two cores idle (waits on subprocesses, servers, rank start-up), and the two share no
# state (their own environments; no Ray, browser or fixed names in the vLLM tests).
# Its output follows the main suite's; either failing fails the target.
test: setup setup-vllm
	@log=$$(mktemp); \
	$(MAKE) --no-print-directory test-vllm > $$log 2>&1 & vllm=$$!; \
	$(PY) -m pytest -q; main=$$?; \
	wait $$vllm; vllm_rc=$$?; \
	echo "--- the vLLM suite (.venv-vllm) ---"; cat $$log; rm -f $$log; \
	test $$main -eq 0 && test $$vllm_rc -eq 0

test-vllm: setup-vllm
	$(VLLM_PY) -m pytest -q -p no:cacheprovider $(VLLM_TESTS)

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
	$(VLLM_PY) benchmarks/engines.py
	$(PY) benchmarks/grpo_vs_trl.py
	$(PY) benchmarks/sandbox.py
	$(PY) benchmarks/eval_parallel.py
	$(PY) benchmarks/async_vs_sync.py
	$(PY) benchmarks/weight_sync.py
	$(PY) benchmarks/rm_server.py
	$(PY) benchmarks/env_service.py
	$(PY) benchmarks/wire_transport.py
	$(PY) benchmarks/sandbox_claims.py
	$(PY) benchmarks/gateway.py

clean:
	rm -rf $(VENV) .venv-vllm runs .pytest_cache .ruff_cache
