# The README's two commands: `make demo` and `make test`. Both set themselves up.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint typecheck unit clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $(STAMP)

demo: venv
	$(VENV)/bin/flockring demo
	$(VENV)/bin/flockring demo-discovery

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-logo

typecheck: venv
	$(VENV)/bin/mypy

# two workers (the machines this runs on have 2 cores); one file per worker, so tests that
# share network namespaces or processes never overlap
unit: venv
	$(VENV)/bin/pytest -n 2 --dist loadfile

test: venv lint typecheck unit

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
