# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.memplan-installed
# MkDocs plugins print a banner about MkDocs 2 on every build; the site builds with MkDocs 1.
export NO_MKDOCS_2_WARNING := 1
export DISABLE_MKDOCS_2_WARNING := true

.PHONY: demo test docs setup clean

demo: $(STAMP)
	mkdir -p out
	$(PY) -m memplan demo --out out/demo

test: $(STAMP) docs
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q -n 2 --dist loadfile

# The documentation site, into site/. Strict: a broken link or a stale API name fails it
# (never with --quiet, which hides the very warnings --strict counts).
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

setup: $(STAMP)

# A host whose Python already has a CUDA build of torch reuses it (system site
# packages); elsewhere the pinned CPU wheel is installed into the venv.
$(STAMP): pyproject.toml Makefile
	@if $(PYTHON) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then \
		echo "reusing the system CUDA torch"; $(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
		$(PYTHON) -m venv $(VENV) && $(PY) -m pip install -q torch==2.13.0; \
	fi
	$(PY) -m pip install -q -e ".[hf,lightning,dev,docs]"
	touch $(STAMP)

clean:
	rm -rf $(VENV) out site
