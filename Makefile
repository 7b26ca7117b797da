# The two commands: `make run` plays/trains Wordle, `make test` runs lint and the tests.
# Both create .venv and install the project on first use (scripts/setup.sh).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup sandboxes browser run test quick lint format docs
setup:
	VENV=$(VENV) ./scripts/setup.sh

# bubblewrap, a Docker daemon and the sandbox image, where this machine allows (see the script)
sandboxes: setup
	VENV=$(VENV) ./scripts/sandbox_setup.sh

# Debian's headless Chromium for the run viewer's browser tests, where this machine allows
browser: setup
	./scripts/browser_setup.sh

run: setup
	$(PY) examples/wordle.py $(ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: lint sandboxes browser
	$(PY) -m pytest $(PYTEST_ARGS)

# lint and the unit tests, without the sandbox or browser set-up: tests marked slow (over 8 s in
# CI), those of Docker, vLLM, a GPU, the process sandbox and Ray are left out (`make test` runs
# everything, as CI does); about 5 minutes on 2 cores
QUICK_TESTS := -m "not slow and not docker and not vllm and not gpu" -k "not process" \
	--ignore=tests/test_sandbox
quick: lint
	$(PY) -m pytest $(QUICK_TESTS) $(PYTEST_ARGS)

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# the API reference, from the docstrings (tests/test_docs.py checks it builds with no broken link)
docs: setup
	$(PY) scripts/api_docs.py docs/api
