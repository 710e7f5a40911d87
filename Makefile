# Long-running checks; each documents itself in its page under docs/benchmarks/ and records its
# last result in bench/results/. PYTHONPATH: the scripts import `service` from this checkout, installed or not.
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))

.PHONY: soak crash long lock served docs

# 16 actors train one server for 10 minutes (NumPy backend): errors, Step accounting, RSS drift,
# promtool on the scrape; writes bench/results/soak.json, exits 1 if a criterion fails.
soak:
	python3 bench/soak.py --actors 16 --duration 600

# The served path: one trident serve and K = 1, 3, 6, 12 actor processes (LobSim, CartPole, a
# no-env load generator over Interact); env steps/s trained, Act latency, CPU, GPU busy
# (docs/benchmarks/served.md); writes bench/results/served.json. On a GPU host: SERVED_SET=--set
# train.backend=cuda.
served:
	python3 bench/served.py $(SERVED_SET)

# LobSim's invariants over 10,000 random steps on 64 markets (CI runs 1,600).
long:
	TRIDENT_LOBSIM_STEPS=10000 python3 -m pytest tests/lobsim/test_env.py -k invariants -s

# 200 SIGKILLs at random moments of checkpoint saves on a real server, a restart after each:
# writes bench/results/crash_trials.json.
crash:
	TRIDENT_CRASH_TRIALS=200 TRIDENT_CRASH_RESULTS=bench/results/crash_trials.json \
		python3 -m pytest tests/reliability/test_crash.py -k sigkill -s

# The image's dependency locks (deploy/requirements-*.lock, pinned with hashes) from
# pyproject.toml, for the image's CPython 3.12 on x86-64 Linux; tests/deploy/test_lock.py fails
# when pyproject.toml asks for something a lock does not pin.
LOCK = uv pip compile pyproject.toml --generate-hashes --python-version 3.12 \
	--python-platform x86_64-manylinux_2_28 --quiet
lock:
	$(LOCK) -o deploy/requirements-cpu.lock
	$(LOCK) --extra cuda -o deploy/requirements-cuda.lock

# The reference site (docs/, Sphinx + MyST) into DOCS_OUT, every warning an error (-W), broken
# cross-references included (-n); tests/project/test_docs.py runs this recipe as written.
# `pip install '.[docs]'`.
DOCS_OUT ?= docs/_build/html
docs:
	python3 -m sphinx -W --keep-going -n -q -b html docs $(DOCS_OUT)
