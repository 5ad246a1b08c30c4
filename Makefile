# xdc: the two commands are `make demo` and `make test`; both go through `make setup`.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
TOXIPROXY_VERSION := v2.12.0
# Stamp depends on pyproject so a dependency change reinstalls; otherwise setup is a no-op.
STAMP := $(VENV)/.setup-stamp

.PHONY: setup demo test test-fast bench soak clean

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

demo: setup
	$(BIN)/xdc demo

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python -m bench.run_all

# 20 random fault schedules per policy (about an hour on 2 cores); tally in bench/results/soak.json.
soak: setup
	$(BIN)/python -m chaos.soak --schedules 20 --out bench/results/soak.json

clean:
	rm -rf $(VENV) runs
