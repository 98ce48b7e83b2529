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
	tests/serve/test_vllm_structured.py tests/engine/test_vllm_lora.py
export TOKENIZERS_PARALLELISM := false

.PHONY: setup setup-vllm demo test test-vllm test-in-process test-sockets test-fast lint format bench clean

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

# The tests that open no TCP socket: no server, Ray, browser or trainer ranks (bubblewrap
# sandboxes and rollout-worker processes, over pipes, are in)
# (tests/conftest.py fails a test of this lane that opens one: the main suite hands
# free ports to its servers and ranks, and a socket here could take one meanwhile).
IN_PROCESS_TESTS := tests/algos tests/config tests/data tests/rollout tests/engine tests/models \
	$(addprefix tests/orchestrator/test_,self_improve_resume.py critic_runs.py \
	  run_dir.py auto_placement.py learning.py checkpoint_by_default.py cannot_learn.py \
	  dpo.py async.py self_improve.py policy_objective_runs.py modes.py turn_credit_run.py \
	  refill.py backend.py reward_check.py stage_model.py advantages_assignment.py \
	  distill_runs.py workers.py) \
	$(addprefix tests/trainer/test_,lora.py critic.py policy_objectives.py packing.py \
	  policy_trainer.py preference_trainer.py sft_loss.py batching.py weight_stream.py distill_trainer.py \
	  checkpoint_retention.py checkpoint.py) \
	$(addprefix tests/cli/test_,startup.py commands.py bad_input.py help.py eval_checkpoint.py) \
	$(addprefix tests/test_,devices_and_extensions.py architecture.py dependencies.py api.py \
	  safe_json.py builder.py) \
	tests/monitor/test_progress.py tests/weights/test_transport.py tests/weights/test_shm_ring.py \
	$(addprefix tests/monitor/test_,health_throughput.py inspect.py sinks_extra.py) \
	$(addprefix tests/orchestrator/test_,health.py run_guard.py sinks_and_profile.py) \
	$(addprefix tests/envs/test_,chain.py code_env.py env_base.py env_tools.py games.py \
	  gym_adapter.py tool_use.py visual_grid.py tool_call_hostile.py browser_actions.py) \
	$(addprefix tests/rewards/test_,code_hacks.py code_hacks_selftest.py code_honest_corpus.py \
	  code_tests.py math_verify_reward.py process_pool.py) \
	tests/sandbox/test_limits.py \
	$(addprefix tests/rewards/test_,gsm8k_gold.py reward_contract.py declared_correctness.py \
	  trl_adapter.py tool_call_ast.py shaping.py format_reward_more.py format_reward.py \
	  combine.py answers.py) \
	$(addprefix tests/eval/test_,bfcl.py suites.py report.py metrics.py harness.py) \
	$(addprefix tests/vision/test_,vlm_training.py vlm_native.py vlm_episodes.py vlm_rollouts.py \
	  images.py collapse_image_runs.py)

# The tests whose servers and clients talk over TCP but that start no Ray cluster,
# trainer ranks or browser env: their fixed ports come from tests/ports.py, a block of
# their own lane's (TEMPER_TEST_LANE=sockets), so they cannot race the main suite's.
SOCKET_TESTS := $(addprefix tests/serve/test_,hostile_requests.py openai_extras.py \
	  openai_server.py reward_model.py server_memory.py tiny_rm_server.py token_ids.py \
	  untrusted_inputs.py) \
	$(addprefix tests/envs/test_,env_service.py mcp_tools.py openenv.py env_soak.py) \
	$(addprefix tests/sandbox/test_,sandbox_service.py isolation.py api.py adversarial.py) \
	$(addprefix tests/monitor/test_,dashboard.py dashboard_browser.py dashboard_hardening.py \
	  dashboard_images.py) \
	tests/agents tests/eval/test_endpoint_eval.py tests/cli/test_env_serve_cli.py \
	$(addprefix tests/orchestrator/test_,env_run.py model_rewards.py distill_served.py) \
	tests/weights/test_broadcast.py tests/vision/test_vlm_serving.py tests/rewards/test_judge.py \
	tests/test_lane_guard.py

# Three pytests run side by side on the two cores: the main suite (Ray, trainer ranks,
# browsers), the in-process tests, and the vLLM suite (its own environment) followed by
# the socket tests. The main suite alone left one core mostly idle (waits on
# subprocesses, servers, rank start-up). The others' output follows the main suite's;
# any failing fails the target.
test: setup setup-vllm
	@logs=$$(mktemp -d); \
	( $(MAKE) --no-print-directory test-vllm > $$logs/vllm 2>&1; echo $$? > $$logs/vllm_rc; \
	  TEMPER_TEST_LANE=sockets $(PY) -m pytest -q -p no:cacheprovider --basetemp=$$logs/s \
	    $(SOCKET_TESTS) > $$logs/sockets 2>&1; echo $$? > $$logs/sockets_rc ) & chain=$$!; \
	TEMPER_TEST_LANE=in-process $(PY) -m pytest -q -p no:cacheprovider \
	  --basetemp=$$logs/t $(IN_PROCESS_TESTS) > $$logs/lane 2>&1 & lane=$$!; \
	$(PY) -m pytest -q $(addprefix --ignore=,$(IN_PROCESS_TESTS) $(SOCKET_TESTS)); main=$$?; \
	wait $$lane; lane_rc=$$?; wait $$chain; \
	echo "--- the in-process tests (TEMPER_TEST_LANE=in-process) ---"; cat $$logs/lane; \
	echo "--- the vLLM suite (.venv-vllm) ---"; cat $$logs/vllm; \
	echo "--- the socket tests (TEMPER_TEST_LANE=sockets) ---"; cat $$logs/sockets; \
	vllm_rc=$$(cat $$logs/vllm_rc); sockets_rc=$$(cat $$logs/sockets_rc); rm -rf $$logs; \
	test $$main -eq 0 && test $$lane_rc -eq 0 && test $$vllm_rc -eq 0 && test $$sockets_rc -eq 0

test-in-process: setup
	TEMPER_TEST_LANE=in-process $(PY) -m pytest -q $(IN_PROCESS_TESTS)

# vLLM's own ports (its process group's store, ZMQ) from the lane's block too.
test-vllm: setup-vllm
	TEMPER_TEST_LANE=vllm VLLM_PORT=28000 $(VLLM_PY) -m pytest -q -p no:cacheprovider $(VLLM_TESTS)

test-sockets: setup
	TEMPER_TEST_LANE=sockets $(PY) -m pytest -q $(SOCKET_TESTS)

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
