# One command to set up and run the main job; one to set up and run every test.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench setup clean chromium

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# CPU build of torch from the local wheel; pinned so nothing pulls a CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test,service,te,fl,sweep,report,chakra]'
	# Chakra traces: the schema and writer only (its other requirements are analysis tools we do not use).
	$(BIN)/pip install --quiet --no-deps mlc-chakra
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/lightrail simulate

test: $(STAMP) chromium
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/python -m pytest -n 2 --dist loadgroup

# The HTML report's browser test runs Debian's chromium (no browser download works offline); CI runs as root.
chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
		if [ "$$(id -u)" = 0 ]; then (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			chromium >/dev/null) || echo "note: installing chromium failed: the browser test will skip"; \
		else echo "note: no /usr/bin/chromium and not root: the browser test will skip"; fi; \
	fi

bench: $(STAMP)
	for f in benchmarks/bench_*.py; do $(BIN)/python $$f; done

clean:
	rm -rf $(VENV) out
