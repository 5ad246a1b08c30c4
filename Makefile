# xdc: the two commands are `make demo` and `make test`; both go through `make setup`.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
TOXIPROXY_VERSION := v2.12.0
# Stamp depends on pyproject so a dependency change reinstalls; otherwise setup is a no-op.
STAMP := $(VENV)/.setup-stamp

.PHONY: setup browser demo test test-fast bench soak noise-floor sim-validate clean compose-generate compose-setup compose-smoke report

setup: $(STAMP) $(BIN)/toxiproxy-server

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

# The real Toxiproxy server: reuse one already on PATH, else build the pinned version with Go.
$(BIN)/toxiproxy-server:
	@mkdir -p $(BIN)
	@if command -v toxiproxy-server >/dev/null 2>&1; then \
	  ln -sf "$$(command -v toxiproxy-server)" $(BIN)/toxiproxy-server; \
	  echo "using toxiproxy-server from PATH: $$(command -v toxiproxy-server)"; \
	else \
	  command -v go >/dev/null 2>&1 || { echo "error: need Go >= 1.23 (or a toxiproxy-server binary on PATH) to install Toxiproxy"; exit 1; }; \
	  tmp=$$(mktemp -d); \
	  GOBIN=$$tmp go install github.com/Shopify/toxiproxy/v2/cmd/server@$(TOXIPROXY_VERSION) && \
	  mv $$tmp/server $(BIN)/toxiproxy-server && rmdir $$tmp; \
	fi

# Debian's Chromium, for the report's browser test (Playwright drives it; no browser download).
CHROMIUM ?= /usr/bin/chromium
APT := $(shell [ "$$(id -u)" = 0 ] && echo apt-get || (command -v sudo >/dev/null && echo "sudo apt-get"))
browser:
	@if [ -x "$(CHROMIUM)" ]; then :; \
	elif [ -z "$(APT)" ]; then echo "error: the browser test needs Debian's chromium at $(CHROMIUM); install it (apt-get install chromium) or set CHROMIUM/XDC_CHROMIUM"; exit 1; \
	else echo "installing Debian's chromium for the report's browser test"; \
	  DEBIAN_FRONTEND=noninteractive $(APT) update -qq && DEBIAN_FRONTEND=noninteractive $(APT) install -y -qq chromium >/dev/null; \
	fi

demo: setup
	$(BIN)/xdc demo

# The published page, results/site/index.html, and the README's answers block, from the committed
# results/ alone: the standard library only (no venv, no training, no network), seconds.
report:
	$(PY) -m xdc.results_page --readme README.md

# The import layers first (pyproject's [tool.importlinter]; no exceptions), then the suite.
# The suite (tests/unit and tests/live) includes the compose smoke (tests/live/test_compose_smoke.py), so it
# needs the engine too.
test: setup browser compose-setup
	$(BIN)/lint-imports
	XDC_CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest -q --durations=25

# The pure-logic unit tests only, tests/unit (no processes, sockets, Toxiproxy or training: a test there that
# starts one is a collection error, tests/live_marking.py): about 40 s on 2 cores, for editing. `make test`
# stays the whole suite.
test-fast: setup
	$(BIN)/python -m pytest -q tests/unit

bench: setup
	$(BIN)/python -m bench.run_all

# The demo config's noise floor: 5 fault-free cluster runs, one per train.seed (real runs; about
# 5 x the time of one demo policy); the record lands in bench/results/noise_floor.json (committed).
noise-floor: setup
	$(BIN)/xdc noise-floor --demo --seeds 5 --out bench/results/noise_floor.json

# The emulator runs the simulator's validation reads (about 1 h 45 min on 2 cores), then the bench
# (bench/sim_validate.py): a fit from three fault-free runs and the four policies under
# scenarios/preemption.yaml and under scenarios/crash-fit.yaml (a crash of c: what a SIGKILL costs), held out: the four policies under scenarios/one-outage.yaml three times
# (the emulator's own run-to-run noise: whether elastic's restarted site joins before or after a
# round's commit differs from run to run, and with it one round's membership), twice more over
# site links the fit never saw (SIMVAL_SLOW), the four policies under scenarios/churn.yaml twice
# (two preemptions at two sites: a scenario the fit never saw whose ranking the policies decide), and
# one-outage twice at four sites (SIMVAL_4SITES: the fit sees only three) and twice at six
# (SIMVAL_6SITES: twice the fit's site count; a site's ~16 ms of CPU a step, six on two cores, stays
# under the floor).
# Every inner step takes at least 100 ms (train.step_floor_ms, an emulated device speed above the
# contended host's ~40 ms), so the host's speed does not set the pace.
SIMVAL_SET = --set train.target_useful_tokens=589824 --set train.step_floor_ms=100
SIMVAL = runs/sim-validation
# The held-out link profile: the fit sees only the demo's 20 ms / 5,000 KB/s site links; these are
# slower (the collective takes about a quarter of each round), so the timing model must carry over.
SIMVAL_SLOW = --set wan.site_link.up.latency_ms=60 --set wan.site_link.down.latency_ms=60 \
  --set wan.site_link.up.bandwidth_kbps=1000 --set wan.site_link.down.bandwidth_kbps=1000
# The held-out site counts: four and six sites on the fitted links (every inner step still paced by the floor).
SIMVAL_4SITES = --set 'cluster.sites=["a","b","c","d"]'
SIMVAL_6SITES = --set 'cluster.sites=["a","b","c","d","e","f"]'
sim-validate: setup
	rm -rf $(SIMVAL)
	$(BIN)/xdc noise-floor --demo --seeds 3 $(SIMVAL_SET) --runs-dir $(SIMVAL)/root/noise-floor --out $(SIMVAL)/noise_floor.json
	$(BIN)/xdc compare --demo scenarios/preemption.yaml $(SIMVAL_SET) --runs-dir $(SIMVAL)/fit/runs --out $(SIMVAL)/fit/compare-preemption --quiet
	$(BIN)/xdc compare --demo scenarios/crash-fit.yaml $(SIMVAL_SET) --runs-dir $(SIMVAL)/fit/crash-runs --out $(SIMVAL)/fit/compare-crash-fit --quiet
	for i in 1 2 3; do $(BIN)/xdc compare --demo scenarios/one-outage.yaml $(SIMVAL_SET) \
	  --runs-dir $(SIMVAL)/root/runs$$i --out $(SIMVAL)/root/compare-oneoutage-$$i --quiet || exit 1; done
	for i in 1 2; do $(BIN)/xdc compare --demo scenarios/one-outage.yaml $(SIMVAL_SET) $(SIMVAL_SLOW) \
	  --runs-dir $(SIMVAL)/root/slow-runs$$i --out $(SIMVAL)/root/compare-oneoutage-slowlinks-$$i --quiet || exit 1; done
	for i in 1 2; do $(BIN)/xdc compare --demo scenarios/churn.yaml $(SIMVAL_SET) \
	  --runs-dir $(SIMVAL)/root/churn-runs$$i --out $(SIMVAL)/root/compare-churn-$$i --quiet || exit 1; done
	for i in 1 2; do $(BIN)/xdc compare --demo scenarios/one-outage.yaml $(SIMVAL_SET) $(SIMVAL_4SITES) \
	  --runs-dir $(SIMVAL)/root/four-runs$$i --out $(SIMVAL)/root/compare-oneoutage-4sites-$$i --quiet || exit 1; done
	for i in 1 2; do $(BIN)/xdc compare --demo scenarios/one-outage.yaml $(SIMVAL_SET) $(SIMVAL_6SITES) \
	  --runs-dir $(SIMVAL)/root/six-runs$$i --out $(SIMVAL)/root/compare-oneoutage-6sites-$$i --quiet || exit 1; done
	$(BIN)/python -m bench.sim_validate --runs-root $(SIMVAL)/root --out $(SIMVAL)/sim \
	  --calibration-extra $(SIMVAL)/fit/compare-preemption --calibration-extra $(SIMVAL)/fit/compare-crash-fit

# 20 random fault schedules per policy (about an hour on 2 cores); tally in bench/results/soak.json.
soak: setup
	$(BIN)/python -m bench.soak --schedules 20 --out bench/results/soak.json

clean:
	rm -rf $(VENV) runs

# ---- docker compose (see docs/compose.md) ----------------------------
SMOKE_RUN ?= smoke-$(shell date +%Y%m%d-%H%M%S)
SMOKE_SCENARIO ?= scenarios/compose-smoke.yaml
# A native run of the same config and scenario to compare the matched-frontier hash with (optional).
SMOKE_NATIVE ?=
# auto: use the pinned upstream images when present or pullable, else build local ones from Debian's
# packages and this venv (always: never pull; never: never build). The choice lands in compose/.env.
XDC_LOCAL_IMAGES ?= auto
COMPOSE_VERSION := v2.29.7

# Regenerate compose/docker-compose.yml (+ .gpu.yml) from the one topology (ground/topology.py).
compose-generate: setup
	$(BIN)/xdc compose generate

# A Docker engine (docker.io, dockerd started if none answers), the compose plugin (built with Go if
# `docker compose version` fails) and the images (compose/setup.sh). A no-op once done, and on a
# normal Docker host.
compose-setup: setup
	@XDC_VENV=$(VENV) XDC_LOCAL_IMAGES=$(XDC_LOCAL_IMAGES) XDC_COMPOSE_VERSION=$(COMPOSE_VERSION) \
	  TOXIPROXY_VERSION=$(TOXIPROXY_VERSION) ./compose/setup.sh

# The compose journey as a person takes it (compose/smoke.sh): build, `up` in the foreground, chaos
# from the host, a network probe from inside site-a; `up` must return 0 by itself with the report on the
# host; check the artifact and what `up` printed; down --volumes, then nothing is left. The run stays
# in ./runs/$(SMOKE_RUN).
compose-smoke: setup compose-setup
	SMOKE_RUN=$(SMOKE_RUN) SMOKE_SCENARIO=$(SMOKE_SCENARIO) SMOKE_NATIVE=$(SMOKE_NATIVE) BIN=$(BIN) ./compose/smoke.sh

# ---- studies (issue 13; docs/studies.md) -------------------------------------------------------
# The three registered studies at full size, one after the other; each resumes from its ledger in
# runs/studies/<name>-v<version>/. Measured on the 2-core machine (docs/studies.md "Results at full size"):
# version 1: learning-efficiency 22 min, equal-work 32 min, controller-heldout 25 of 42 runs in 70 min (not finished);
# version 2 (2026-12-02): learning-efficiency 11 min 28 s, equal-work 14 min; controller-heldout
# version 5: 42 runs in 98 min at b9d60b3, mostly beside a clean-clone CI (100 and 79 min in earlier runs).
STUDIES ?= learning-efficiency equal-work controller-heldout
.PHONY: studies
studies: setup
	@for s in $(STUDIES); do $(BIN)/xdc study run studies/protocols/$$s.yaml || exit $$?; done

# Issue 14's 2 x 2 checkpoint-cadence x continuation energy study at full size (37 runs; hours on 2 cores),
# resumable in runs/studies/cadence-continuation-v1/.
.PHONY: study-cadence
study-cadence: setup
	$(BIN)/xdc study run studies/protocols/cadence-continuation.yaml
