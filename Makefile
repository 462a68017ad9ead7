# mooncake-assets: `make demo` and `make test` work on a fresh clone.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXT_SRC := $(shell find mooncake_assets -name '*.pyx' -o -name '*.pxd')
EXT_STAMP := $(VENV)/.ext-built

.PHONY: install demo lint test test-quick ui bench clean system-deps

install: $(STAMP) $(EXT_STAMP)

# the compiled engine modules (Cython, setup.py): rebuilt in place when a .pyx/.pxd changes
$(EXT_STAMP): $(STAMP) setup.py $(EXT_SRC)
	$(BIN)/python setup.py -q build_ext --inplace
	touch $@

# Debian packages the tests need: PostgreSQL (initdb, pg_ctl, pgbench, pg_recvlogical; contrib for
# hstore/ltree), PostGIS for the server's major version (geometry/geography mapping tests), Chromium
# for the Dagster UI test, sysbench (its OLTP workloads, tests/integration/test_sysbench.py), Node.js + npm for
# Azurite (the Azure Blob emulator of the abfs:// tests). Installed only when missing (CI runs as root
# on Debian). Only the missing ones are asked for: a
# machine with NodeSource's nodejs (which carries npm) must not be asked for Debian's npm, which
# conflicts with it.
system-deps:
	@missing=""; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql postgresql-contrib"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v sysbench >/dev/null 2>&1 || missing="$$missing sysbench"; \
	command -v node >/dev/null 2>&1 || missing="$$missing nodejs"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing npm"; \
	if [ -n "$$missing" ] || ! ls /usr/share/postgresql/*/extension/postgis.control >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq; \
	    if [ -n "$$missing" ]; then \
	      echo "installing Debian packages:$$missing"; \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null \
	        || echo "warning: apt-get could not install$$missing (tests that need them will skip)"; \
	    fi; \
	    major=$$(ls /usr/lib/postgresql/ | sort -n | tail -1); \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-$$major-postgis-3 >/dev/null \
	      || echo "warning: postgresql-$$major-postgis-3 could not be installed (PostGIS tests will skip)"; \
	  else echo "warning: install Debian's$$missing packages (need root)"; fi; \
	fi

# Azurite (npm) for the Azure tests, in the venv: tests find it at $(AZURITE).
# 3.35 is the newest release whose engines accept Debian's Node 20.
AZURITE_VERSION := 3.35.0
AZURITE := $(VENV)/node/node_modules/.bin/azurite-blob
$(AZURITE):
	npm install --silent --no-audit --no-fund --prefix $(VENV)/node azurite@$(AZURITE_VERSION)

$(STAMP): pyproject.toml Makefile
	$(MAKE) system-deps
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip "setuptools>=77"
	$(BIN)/pip install -q -e '.[test]'
	$(MAKE) $(AZURITE)
	touch $(STAMP)

demo: install
	$(BIN)/mooncake demo

# Lint, format, types, layer contracts (pyproject.toml: [tool.ruff], [tool.mypy], [tool.importlinter];
# docs/architecture.md#layer-contracts). Every tool runs, then the target fails if any of them did.
lint: install
	@rc=0; \
	echo "== ruff check"; $(BIN)/ruff check --output-format concise . || rc=1; \
	echo "== ruff format --check"; $(BIN)/ruff format --check --output-format concise . || rc=1; \
	echo "== mypy"; $(BIN)/mypy || rc=1; \
	echo "== lint-imports"; $(BIN)/lint-imports --no-cache || rc=1; \
	exit $$rc

# the lint gates first (each stops the run; `make lint` shows every finding at once)
test: install
	$(BIN)/ruff check --output-format concise .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	$(BIN)/dagster definitions validate -w workspace.yaml
	$(BIN)/python -m pytest -q

test-quick: install
	$(BIN)/python -m pytest -q -m "not slow and not ui"

# make ui PORT=3001 HOST=0.0.0.0 UI_ARGS="--rate 50"
ui: install
	$(BIN)/mooncake ui $(if $(PORT),--port $(PORT)) $(if $(HOST),--host $(HOST)) $(UI_ARGS)

bench: install
	$(BIN)/mooncake bench --json bench.json --plots bench-plots

clean:
	rm -rf $(VENV) .mooncake
