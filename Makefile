# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.memplan-installed

.PHONY: demo test setup clean

demo: $(STAMP)
	mkdir -p out
	$(PY) -m memplan demo --out out/demo

test: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q -n 2 --dist loadfile

setup: $(STAMP)

# A host whose Python already has a CUDA build of torch reuses it (system site
# packages); elsewhere the pinned CPU wheel is installed into the venv.
$(STAMP): pyproject.toml Makefile
	@if $(PYTHON) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then \
		echo "reusing the system CUDA torch"; $(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
		$(PYTHON) -m venv $(VENV) && $(PY) -m pip install -q torch==2.13.0; \
	fi
	$(PY) -m pip install -q -e ".[hf,dev]"
	touch $(STAMP)

clean:
	rm -rf $(VENV) out
