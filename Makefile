# One command to set up and run the main job; one to set up and run every test.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench setup clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# CPU build of torch from the local wheel; pinned so nothing pulls a CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test,service,te,fl]'
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/lightrail simulate

test: $(STAMP)
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/python -m pytest

bench: $(STAMP)
	for f in benchmarks/bench_*.py; do $(BIN)/python $$f; done

clean:
	rm -rf $(VENV) out
