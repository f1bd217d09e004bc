# gpuspawner: one command for the tests, one for the demo. Both install what they need.
#
#   make test    install everything, build the devcluster once, run all tests
#   make demo    the GPU hub on a simulated GPU cluster (see README.md)
#   make fuzz    >= 10,000 generated spawn requests through a real hub's REST API and form
#                (tests/api/test_fuzz.py; CI runs a few hundred of them in `make test`)
#
# The Python environment lives in .venv; npm packages (configurable-http-proxy,
# playwright-core) in node_modules; the Kubernetes binaries in ~/.cache/gpuspawner.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test unit fuzz install devcluster-build demo bench clean

test: install devcluster-build
	$(PY) -m pytest -q -p no:cacheprovider

unit: install
	$(PY) -m pytest -q -p no:cacheprovider tests/unit

fuzz: install devcluster-build
	GPUSPAWNER_FUZZ_EXAMPLES=100 GPUSPAWNER_FUZZ_BATCH=200 GPUSPAWNER_FUZZ_WORKERS=24 GPUSPAWNER_FUZZ_MIN_REQUESTS=10000 \
		$(PY) -m pytest -q -s -p no:cacheprovider tests/api/test_fuzz.py

$(STAMP): pyproject.toml package.json
	@command -v go >/dev/null || { echo "Go 1.26+ is needed to build the devcluster: https://go.dev/dl/"; exit 1; }
	@command -v npm >/dev/null || { echo "Node.js and npm are needed for configurable-http-proxy"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	npm install --no-audit --no-fund --loglevel=error
	bash scripts/install-browser.sh
	touch $(STAMP)

install: $(STAMP)

devcluster-build: install
	$(VENV)/bin/gpuspawner devcluster build

demo: install devcluster-build
	$(PY) -m gpuspawner.demo

bench: install devcluster-build
	$(PY) -m bench

clean:
	rm -rf $(VENV) node_modules test-artifacts
