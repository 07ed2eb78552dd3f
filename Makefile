# The two commands: `make demo` (a complete local release, verified) and `make test`.
# Both run `make setup` first, which installs and starts what they need.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
BENCHSEAL := $(VENV)/bin/benchseal
TAG ?= v0.0.0-demo
# AGENT=terminus-2 runs Harbor's model-backed agent against the scripted model
# (MODEL_SCRIPT=right scores 1.0, wrong scores 0; MODEL_SCRIPT= uses $$BENCHSEAL_AGENT_API_KEY
# and the policy's endpoint as they are).
AGENT ?= oracle
MODEL_SCRIPT ?= right

.PHONY: setup demo test lint bench clean-state

setup:
	@bash scripts/setup.sh

demo: setup
	$(BENCHSEAL) release $(TAG) --local --agent $(AGENT) \
	  $(if $(and $(filter terminus-2,$(AGENT)),$(MODEL_SCRIPT)),--scripted-model $(MODEL_SCRIPT))

# pytest exits 5 when it collected no test: that is a failure here, not a pass.
test: setup
	@set +e; $(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc

lint: setup
	$(VENV)/bin/ruff check pipeline tests bench
	$(VENV)/bin/mypy

bench: setup
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean-state:
	$(BENCHSEAL) local registry stop || true
	rm -rf .benchseal dist
