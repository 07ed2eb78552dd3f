# The two commands: `make demo` (a complete local release, verified) and `make test`.
# Both run `make setup` first, which installs and starts what they need.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
BENCHSEAL := $(VENV)/bin/benchseal
# The agent make demo scores. By default the example adopter's own agent (examples/hello-agent,
# released as v0.1.0); AGENT=qwen-code scores Qwen Code's npm release v0.24.4 (examples/qwen-code).
# AGENT=oracle / nop are Harbor's calibration agents (1.0 / 0.0 on a sound suite); AGENT=terminus-2
# is Harbor's model-backed agent. Model-backed agents run against the scripted model
# (MODEL_SCRIPT=right scores 1.0, wrong scores 0; MODEL_SCRIPT= uses $$BENCHSEAL_AGENT_API_KEY
# and the policy's endpoint as they are).
# SUITE: a suite of policies/infra.yaml (default smoke). SUITE=humaneval runs HumanEval's 164 tasks (imported into
# suites/humaneval by make setup) with the oracle unless AGENT says otherwise (AGENT=nop scores 0), each agent
# under a tag of its own.
SUITE ?= smoke
AGENT_humaneval := oracle
AGENT ?= $(or $(AGENT_$(SUITE)),hello-agent)
MODEL_SCRIPT ?= right
MODEL_AGENTS := terminus-2 hello-agent qwen-code
PROJECT_hello-agent := examples/hello-agent/benchseal.toml
PROJECT_qwen-code := examples/qwen-code/benchseal.toml
TAG_hello-agent := v0.1.0
TAG_qwen-code := v0.24.4
# nop has a tag of its own: a re-run of oracle's tag would get that tag's first baseline, never oracle's
# scoring (a tag is released once), so AGENT=nop after AGENT=oracle is compared with oracle's release.
TAG_nop := v0.0.1-demo
PROJECT ?= $(PROJECT_$(AGENT))
TAG_humaneval_oracle := v0.0.2-humaneval
TAG_humaneval_nop := v0.0.3-humaneval
TAG ?= $(or $(TAG_$(SUITE)_$(AGENT)),$(TAG_$(AGENT)),v0.0.0-demo)

.PHONY: setup demo test lint bench mutate clean-state

setup:
	@bash scripts/setup.sh

demo: setup
	$(BENCHSEAL) release $(TAG) --local --suite $(SUITE) --agent $(AGENT) $(if $(PROJECT),--project $(PROJECT)) \
	  $(if $(and $(filter $(MODEL_AGENTS),$(AGENT)),$(MODEL_SCRIPT)),--scripted-model $(MODEL_SCRIPT))

# pytest exits 5 when it collected no test: that is a failure here, not a pass.
# TEST_WORKERS pytest-xdist workers (most tests wait on engines, registries and subprocesses, so more
# workers than the 2 cores pay); -n N runs as --dist loadgroup, which keeps each xdist_group on one
# worker (tests/fixtures/parallel.py). TEST_WORKERS=0 runs the suite in this one process.
# --durations=25: the 25 slowest tests close the output (what to mark slow, what to make faster).
TEST_WORKERS ?= 4
test: setup
	@set +e; $(PY) -m pytest -n $(TEST_WORKERS) --durations=25 $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc

lint: setup
	$(VENV)/bin/ruff check pipeline tests bench
	$(VENV)/bin/mypy

bench: setup
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# Mutation testing of the security modules (issue 39.3; not part of `make test`; docs/architecture.md
# "Mutation testing"; [tool.mutmut] in pyproject.toml names the modules and their fast tests). MUTANTS narrows
# the run to mutmut name globs (e.g. MUTANTS='pipeline.core.contracts.*') and re-checks every mutant they name;
# without MUTANTS a run checks only mutants of functions whose source changed since their result (all of them
# when [tool.mutmut]'s test selection or pytest arguments change: mutmut then drops every result). MUTATE_TIMEOUT
# bounds its wall clock in seconds. The score (scripts/mutation_score.py, per module, for the MUTANTS asked) fails
# under 90 % detected, the equivalent mutants listed in docs/mutation-equivalents.md aside.
# mutants/ is a copy of the checkout without node_modules: the Node verifiers' tests read the checkout's.
MUTANTS ?=
MUTATE_TIMEOUT ?= 10800
MUTATE_CHILDREN ?= 2
mutate: setup
	@start=$$(date +%s); BENCHSEAL_NODE_MODULES=$${BENCHSEAL_NODE_MODULES:-$(CURDIR)/node_modules} \
	  timeout -k 10 $(MUTATE_TIMEOUT) $(VENV)/bin/mutmut run --max-children $(MUTATE_CHILDREN) $(MUTANTS); \
	rc=$$?; if [ $$rc -eq 124 ]; then echo "make mutate: stopped after $(MUTATE_TIMEOUT) s (MUTATE_TIMEOUT)" >&2; \
	elif [ $$rc -ne 0 ]; then echo "make mutate: mutmut exited $$rc" >&2; exit $$rc; fi; \
	echo "make mutate: mutmut ran $$(( $$(date +%s) - start )) s"; \
	$(PY) scripts/mutation_score.py $(MUTANTS)

clean-state:
	$(BENCHSEAL) local registry stop || true
	rm -rf .benchseal dist
