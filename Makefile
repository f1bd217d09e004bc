# gpuspawner: one command for the tests, one for the demo. Both install what they need.
#
#   make test    install everything, build the devcluster once, check the layers
#                (make lint), run all tests
#   make lint    the import-linter contracts of pyproject.toml: the layers and the pure
#                core's "no I/O" (docs/architecture.md); a wrong import is named; and
#                mypy, strict on all of gpuspawner (but devcluster/cluster.py, a list that
#                only shrinks); ruff's lint and format check
#   make demo    the GPU hub on a simulated GPU cluster (see README.md); KUEUE=1: with the
#                real Kueue and a batch Job competing for the same GPUs (docs/kueue.md);
#                AUTOSCALE=1: GPU pools at zero nodes grown by the real Karpenter (docs/autoscaling.md)
#   make test-fast  the fast tier: the pure-Python tests (tests/unit: no cluster, no hub process,
#                no Go, npm or Chromium), 1.5-2.5 minutes on 2 cores; `make unit` is the same
#   make test-hub, test-cluster, test-stories, test-kueue  the other tiers alone (below)
#   make labextension  rebuild the notebook's GPU view for JupyterLab (ui/labextension, npm)
#                into gpuspawner/notebook_ext/labextension; the build backend builds it on
#                install from a clean clone and into the wheel (never committed; tests check
#                it matches its sources)
#   make fuzz    >= 10,000 generated spawn requests through a real hub's REST API and form
#                (tests/api/test_fuzz.py; CI runs a few hundred of them in `make test`)
#
# Long checks (not part of `make test`, which runs small fixed-seed versions of them):
#
#   make capacity-truth   free counts against the real kube-scheduler on 200 random
#                         cluster states (STATES=N for more); prints
#                         "K of M offerings agree over N states"
#   make dra-truth        DRA free counts against the real scheduler's allocator on 100
#                         random states of the simulated NVIDIA DRA driver (DRA_STATES=N),
#                         per kind: whole and static MIG devices, dynamic MIG, the
#                         extended-resource mapping, GPU-memory shares (capacity), device taints;
#                         and 200 states that mix them with cordons, node taints, tight cpu and
#                         DeviceTaintRules (mixed)
#   make fuzz-clusters    discovery/capacity properties on 30,000 generated clusters
#   make test-oldest-k8s  the device-plugin and DRA spawn suites on the oldest Kubernetes
#                         GPUSpawner supports (build.RELEASES' last, 1.34; its own binaries:
#                         about 10 minutes more the first time); tests of newer features
#                         skip, naming the release they need (docs/dra.md's table)
#   make bench            the benchmarks, printed side by side
#   make kueue-check      only the tests on the real Kueue (built from its Go module, a few
#                         minutes the first time; make test runs them too): queues, held,
#                         refused and preempted spawns, Kueue down (tests/kueue, docs/kueue.md)
#   make karpenter-check  only the tests on the real Karpenter (its kwok cloud provider, built
#                         from its Go module, 2 to 5 minutes the first time; make test runs them
#                         too): pending GPU pods bring up nodes of their pools (tests/karpenter)
#   make kueue-bench      spawn to admission through a LocalQueue with free quota vs the same
#                         offering without Kueue, on a devcluster with the real Kueue (median
#                         and p90 of 20 spawns each, side by side; bench/kueue_latency.py)
#   make autoscale-bench  spawn to ready on a scale-from-zero pool of the real Karpenter, and the
#                         answer on a pool that cannot grow, GPUSpawner vs KubeSpawner with the
#                         same pod (AUTOSCALE_REPEATS, default 3, order alternated; about 12
#                         minutes on 2 cores; bench/autoscale_start.py, docs/autoscaling.md)
#   make framework-check  the memory guard against framework releases too big for make test:
#                         older jaxlib (JAXLIB_OLD, default 0.4.30 and 0.4.38: the last that
#                         reads only XLA_PYTHON_CLIENT_MEM_FRACTION and the first seen to read
#                         both; about 80 MB to download, 300-370 MB unpacked each) and the
#                         real TensorFlow (tensorflow-cpu TF_VERSION, about 1.6 GB in its own
#                         venv) meeting the hook's set_memory_growth wrapper
#                         (scripts/framework_check_tf.py). All in .venv-frameworks/; a few
#                         minutes the first time (the TensorFlow install), under a minute after
#   make gpu-check        on a machine with an NVIDIA GPU: JAX, PyTorch and TensorFlow under
#                         the memory guard, each allocating past its cap, and the probe beside
#                         nvidia-smi (scripts/gpu_check.py; GPU_CHECK_PYTHON=... names a Python
#                         with the CUDA builds; nothing is installed). Without a GPU it stops
#                         at once with status 2 and says so
#
# The Python environment lives in .venv; npm packages (configurable-http-proxy,
# playwright-core) in node_modules; the Kubernetes binaries, Prometheus and promtool in
# ~/.cache/gpuspawner (built once by devcluster-build).

PYTHON ?= python3
STATES ?= 200
CLUSTERS ?= 30000
VENV   := .venv
PY     := $(VENV)/bin/python
PYSTAMP := $(VENV)/.installed-python
STAMP  := $(VENV)/.installed

PHONY_TIERS := test-hub test-cluster test-stories test-kueue
.PHONY: test test-fast $(PHONY_TIERS) lint precommit unit fuzz labextension install devcluster-build demo bench scale capacity-truth dra-truth fuzz-clusters framework-check gpu-check kueue-check karpenter-check kueue-bench autoscale-bench test-oldest-k8s clean

# `make test` runs three pytest processes side by side, each with a devcluster of its own (each
# claims its own ports and loopback pod network): the stories (tests/e2e, tests/browser: each
# module starts a whole demo hub and mostly waits on it), the culler against real hubs and the
# tests on the real Kueue and the scale benchmark at its small fixed size and the tests on the
# real Karpenter (tests/culler/test_culler_*.py, tests/kueue, tests/scale, tests/karpenter:
# mostly waiting on hubs and kernels, Kueue, Karpenter or on storms of spawns, at a lower CPU
# priority; the culler's first, as they need no cluster), and the rest. One machine's CPUs are
# then busy instead of idle while hubs start, and the three take about as long. The stories'
# and the others' output follow the main run's; any failing fails the run.
STORIES := tests/e2e tests/browser
APART := tests/kueue tests/scale tests/karpenter
# The culler's tests against real hubs (no cluster, no Kueue): in `make test` beside APART, so
# that the main run is not the one everything waits for; in `make test-hub` with the rest of tests/culler.
CULLER_HUBS := $(sort $(wildcard tests/culler/test_culler_*.py))
test: install devcluster-build lint precommit
	$(VENV)/bin/gpuspawner devcluster build --kueue --karpenter
	@logs=$$(mktemp -d); \
	GPUSPAWNER_KUEUE_TESTS=1 GPUSPAWNER_KARPENTER_TESTS=1 nice -n 10 $(PY) -m pytest -q -p no:cacheprovider --durations=10 $(CULLER_HUBS) $(APART) >$$logs/kueue 2>&1 & kueue=$$!; \
	$(PY) -m pytest -q -p no:cacheprovider --durations=15 $(STORIES) >$$logs/stories 2>&1 & stories=$$!; \
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 $(foreach d,$(STORIES) $(APART) $(CULLER_HUBS),--ignore=$(d)); main=$$?; \
	wait $$stories; stories_status=$$?; wait $$kueue; kueue_status=$$?; \
	echo "---- $(STORIES) (whole demo hubs) ----"; cat $$logs/stories; \
	echo "---- tests/culler/test_culler_*.py $(APART) (the culler against real hubs; the real Kueue; the scale benchmark, small; the real Karpenter) ----"; cat $$logs/kueue; rm -rf $$logs; \
	test $$main -eq 0 && test $$stories_status -eq 0 && test $$kueue_status -eq 0

# The pre-commit hooks that `make lint` does not already run (end of files, whitespace, YAML,
# TOML, prettier on ui/ and charts/): a fixer that changes a file fails the run.
precommit: install
	SKIP=ruff,ruff-format,mypy,import-linter $(VENV)/bin/pre-commit run --all-files --show-diff-on-failure

lint: $(PYSTAMP)
	$(VENV)/bin/lint-imports --no-cache --no-logo
	$(VENV)/bin/mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Python only: no Go, npm or Chromium (the browser and cluster tests live in their own folders).
test-fast: $(PYSTAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests/unit

unit: test-fast

# The other tiers, each alone (`make test` runs them all, three pytest processes side by side,
# the culler's real-hub tests of test-hub in test-kueue's process):
#   test-hub      real JupyterHub processes, no cluster tier of their own: the REST API and form,
#                 KubeSpawner compatibility, the culler, the notebook's GPU view, the probe, the wheel
#   test-cluster  the devcluster's real kube-apiserver and kube-scheduler (tests/integration)
#   test-stories  whole demo hubs driven by Chromium (tests/e2e, tests/browser)
#   test-kueue    the real Kueue, the scale benchmark at its small size and the real Karpenter
#                 (tests/kueue, tests/scale, tests/karpenter)
HUB_TIER := tests/api tests/compat tests/culler tests/notebook_ext tests/probe tests/wheel
test-hub: install devcluster-build
	$(PY) -m pytest -q -p no:cacheprovider --durations=10 $(HUB_TIER)

test-cluster: install devcluster-build
	$(PY) -m pytest -q -p no:cacheprovider --durations=10 tests/integration

test-stories: install devcluster-build
	$(PY) -m pytest -q -p no:cacheprovider --durations=10 $(STORIES)

test-kueue: install devcluster-build
	$(VENV)/bin/gpuspawner devcluster build --kueue --karpenter
	GPUSPAWNER_KUEUE_TESTS=1 GPUSPAWNER_KARPENTER_TESTS=1 $(PY) -m pytest -q -p no:cacheprovider --durations=10 $(APART)

fuzz: install devcluster-build
	GPUSPAWNER_FUZZ_EXAMPLES=100 GPUSPAWNER_FUZZ_BATCH=200 GPUSPAWNER_FUZZ_WORKERS=24 GPUSPAWNER_FUZZ_MIN_REQUESTS=10000 \
		$(PY) -m pytest -q -s -p no:cacheprovider -o timeout=0 tests/api/test_fuzz.py

LABEXT := ui/labextension

labextension: $(PYSTAMP)
	rm -rf gpuspawner/notebook_ext/labextension
	$(PY) -m pip install -q --no-deps -e .  # the build backend builds it (and the venv's copy, which demo pods load)

$(PYSTAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $(PYSTAMP)

$(STAMP): $(PYSTAMP) package.json
	@command -v go >/dev/null || { echo "Go 1.26+ is needed to build the devcluster: https://go.dev/dl/"; exit 1; }
	@command -v npm >/dev/null || { echo "Node.js and npm are needed for configurable-http-proxy"; exit 1; }
	npm install --no-audit --no-fund --loglevel=error
	bash scripts/install-browser.sh
	touch $(STAMP)

install: $(STAMP)

devcluster-build: install
	$(VENV)/bin/gpuspawner devcluster build

demo: install devcluster-build
	$(if $(filter 1,$(KUEUE)),$(VENV)/bin/gpuspawner devcluster build --kueue)
	$(if $(filter 1,$(AUTOSCALE)),$(VENV)/bin/gpuspawner devcluster build --karpenter)
	$(PY) -m gpuspawner.tools.demo $(if $(filter 1,$(KUEUE)),--kueue) $(if $(filter 1,$(AUTOSCALE)),--autoscale)

bench: install devcluster-build
	$(PY) -m bench

# Issue 30's storm: 1,000 GPU nodes, 20,000 other pods, 3,000 users, 600 spawns in 60 s, on
# GPUSpawner and plain KubeSpawner side by side; then the same storm with the hub and the API
# server restarted in it; then the culler's cycle at 3,000 servers next to jupyterhub-idle-culler's.
# The first storm is repeated SCALE_REPEATS times (default 3) with the spawners' order alternated,
# then summed up as medians and spread with every spawn's fate per side. About 25 minutes on 2 cores
# per repeat. SCALE_ARGS for other sizes (python -m bench.scale --help).
# SCALE_DBS: the hubs' databases, each a run of its own (PostgreSQL: Debian's postgresql package,
# started by the benchmark as the postgres user).
SCALE_REPEATS ?= 3
SCALE_DBS ?= sqlite postgresql
scale: install devcluster-build
	for db in $(SCALE_DBS); do $(PY) -m bench.scale --db $$db --repeats $(SCALE_REPEATS) $(SCALE_ARGS) || exit 1; done
	$(PY) -m bench.scale --faults $(SCALE_ARGS)
	$(PY) -m bench.culler_bench --servers $(or $(CULLER_SERVERS),3000) --prometheus-outage 60

capacity-truth: install devcluster-build
	$(PY) -m gpuspawner.devcluster.truth --states $(STATES) --quiet

dra-truth: install devcluster-build
	$(PY) -m gpuspawner.devcluster.dratruth --states $(or $(DRA_STATES),100) --quiet
	$(PY) -m gpuspawner.devcluster.dratruth --kind dynamic-mig --states $(or $(DRA_STATES),100) --quiet
	$(PY) -m gpuspawner.devcluster.dratruth --kind extres --states $(or $(DRA_STATES),100) --quiet
	$(PY) -m gpuspawner.devcluster.dratruth --kind capacity --states $(or $(DRA_STATES),100) --quiet
	$(PY) -m gpuspawner.devcluster.dratruth --kind taints --states $(or $(DRA_STATES),100) --quiet
	$(PY) -m gpuspawner.devcluster.dratruth --kind mixed --states $(or $(DRA_STATES),200) --quiet

# GPUSPAWNER_K8S_VERSION=oldest: the devcluster builds and runs the last release of
# gpuspawner/devcluster/build.py's RELEASES, cached apart from the default one.
OLDEST_K8S_TESTS := tests/integration/test_devcluster.py tests/integration/test_spawner.py \
	tests/integration/test_admission.py tests/integration/test_dra_driver.py \
	tests/integration/test_dra_spawn.py tests/integration/test_dra_truth.py tests/compat
test-oldest-k8s: install
	GPUSPAWNER_K8S_VERSION=oldest $(VENV)/bin/gpuspawner devcluster build
	GPUSPAWNER_K8S_VERSION=oldest $(PY) -m pytest -q -p no:cacheprovider -rs $(OLDEST_K8S_TESTS)

kueue-check: install devcluster-build
	$(VENV)/bin/gpuspawner devcluster build --kueue
	GPUSPAWNER_KUEUE_TESTS=1 $(PY) -m pytest -q -p no:cacheprovider tests/kueue

karpenter-check: install devcluster-build
	$(VENV)/bin/gpuspawner devcluster build --karpenter
	GPUSPAWNER_KARPENTER_TESTS=1 $(PY) -m pytest -q -p no:cacheprovider tests/karpenter

kueue-bench: install devcluster-build
	$(VENV)/bin/gpuspawner devcluster build --kueue
	$(PY) -m bench.kueue_latency --spawns $(or $(KUEUE_SPAWNS),20)

autoscale-bench: install devcluster-build
	$(VENV)/bin/gpuspawner devcluster build --karpenter
	$(PY) -m bench.autoscale_start --repeats $(or $(AUTOSCALE_REPEATS),3)

fuzz-clusters: install
	GPUSPAWNER_CLUSTERS=$(CLUSTERS) $(PY) -m pytest -q -p no:cacheprovider tests/unit/test_cluster_properties.py

JAXLIB_OLD ?= 0.4.30 0.4.38
TF_VERSION ?= 2.21.0

framework-check: $(PYSTAMP)
	@for v in $(JAXLIB_OLD); do \
		echo "== jaxlib $$v"; \
		$(PY) -m pip install -q --no-deps --target .venv-frameworks/jaxlib-$$v "jaxlib==$$v" || exit 1; \
		PYTHONPATH=.venv-frameworks/jaxlib-$$v $(PY) -c "import jaxlib, sys; sys.exit(jaxlib.__version__ != '$$v')" || { echo "jaxlib $$v is not the one imported"; exit 1; }; \
		PYTHONPATH=.venv-frameworks/jaxlib-$$v $(PY) -m pytest -q -p no:cacheprovider tests/unit/test_memguard_frameworks.py -k real_jaxlib || exit 1; \
	done
	test -x .venv-frameworks/tensorflow/bin/python || $(PYTHON) -m venv .venv-frameworks/tensorflow
	.venv-frameworks/tensorflow/bin/python -m pip install -q "tensorflow-cpu==$(TF_VERSION)"
	TF_CPP_MIN_LOG_LEVEL=2 .venv-frameworks/tensorflow/bin/python scripts/framework_check_tf.py

GPU_CHECK_PYTHON ?= $(PY)

gpu-check: $(PYSTAMP)
	$(PY) scripts/gpu_check.py --python $(GPU_CHECK_PYTHON)

clean:
	rm -rf $(VENV) .venv-frameworks node_modules test-artifacts
