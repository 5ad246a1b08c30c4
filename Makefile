# xdc: the two commands are `make demo` and `make test`; both go through `make setup`.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
TOXIPROXY_VERSION := v2.12.0
# Stamp depends on pyproject so a dependency change reinstalls; otherwise setup is a no-op.
STAMP := $(VENV)/.setup-stamp

.PHONY: setup browser demo test test-fast bench soak noise-floor clean compose-generate compose-smoke

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

test: setup browser
	XDC_CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python -m bench.run_all

# The demo config's noise floor: 5 fault-free cluster runs, one per train.seed (real runs; about
# 5 x the time of one demo policy); the record lands in bench/results/noise_floor.json (committed).
noise-floor: setup
	$(BIN)/xdc noise-floor --demo --seeds 5 --out bench/results/noise_floor.json

# 20 random fault schedules per policy (about an hour on 2 cores); tally in bench/results/soak.json.
soak: setup
	$(BIN)/python -m chaos.soak --schedules 20 --out bench/results/soak.json

clean:
	rm -rf $(VENV) runs

# ---- docker compose (see README "Docker compose and several hosts") ----------------------------
COMPOSE := docker compose -f compose/docker-compose.yml
SMOKE_RUN ?= smoke-$(shell date +%Y%m%d-%H%M%S)
SMOKE_SCENARIO ?= scenarios/one-outage.yaml

# Regenerate compose/docker-compose.yml (+ .gpu.yml) from the one topology (xdc/topology.py).
compose-generate: setup
	$(BIN)/xdc compose generate

# Bring the cluster up with an engine, run a short scenario against it from the host, summarise and
# analyse the run from the shared runs volume (bound to ./runs), tear everything down.
compose-smoke: setup
	@docker info >/dev/null 2>&1 || { echo "error: compose-smoke needs a running Docker engine (docker info failed); the compose file itself is checked without one by: $(BIN)/python -m pytest tests/test_compose_*.py"; exit 1; }
	@docker compose version >/dev/null 2>&1 || { echo "error: compose-smoke needs the docker compose plugin (docker compose version failed)"; exit 1; }
	$(BIN)/xdc compose generate --check
	mkdir -p runs
	docker volume rm -f xdc-runs-smoke >/dev/null 2>&1 || true
	docker volume create --driver local --opt type=none --opt o=bind --opt device=$(CURDIR)/runs xdc-runs-smoke >/dev/null
	set -e; export XDC_RUN_ID=$(SMOKE_RUN) XDC_RUNS_VOLUME=xdc-runs-smoke XDC_UID=$$(id -u) DOCKER_GID=$$(stat -c %g /var/run/docker.sock 2>/dev/null || echo 0); \
	  trap '$(COMPOSE) --profile chaos --profile analyze down --volumes --remove-orphans' EXIT; \
	  $(COMPOSE) build; \
	  $(COMPOSE) up -d; \
	  $(BIN)/xdc chaos $(SMOKE_SCENARIO) --run runs/$(SMOKE_RUN) --docker --project xdc --toxiproxy 127.0.0.1:$${XDC_TOXIPROXY_API_PORT:-8474}; \
	  $(COMPOSE) wait coordinator site-a site-b site-c || true; \
	  $(COMPOSE) run --rm analyze; \
	  $(BIN)/python -c "import json,sys; a=json.load(open('runs/$(SMOKE_RUN)/artifact.json')); m=a['runs'][0]['metrics']; bad=[c['name'] for c in a['checks'] if c['status']=='fail']; print('compose-smoke: useful tokens', m['useful_tokens']['value'], 'failed checks', bad, 'report runs/$(SMOKE_RUN)/report/index.html'); sys.exit(1 if bad else 0)"
	docker volume rm -f xdc-runs-smoke >/dev/null 2>&1 || true
