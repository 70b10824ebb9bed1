# The README's two set-up commands: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: run test test-all test-compiled test-wheel compile clean-compiled release-check docs docs-build manual lint typecheck check system-deps bench clean

# The hot modules are built with mypyc first where gcc and the Python headers are (once, and again after
# their source changes); elsewhere, or with TRIMARAN_INTERPRETED=1, the source runs.
run: $(VENV)/.installed-run
	$(BIN)/python scripts/compile.py --if-possible
	$(BIN)/trimaran serve $(ARGS)

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest $(ARGS)

# The hot modules (trimaran/compiled.py) built with mypyc, in place beside their sources (gcc and the
# Python headers; a few minutes). `make run` does it on its own; `make test` then uses them too.
# TRIMARAN_INTERPRETED=1 or `make clean-compiled` goes back to the source, which is the fallback.
compile: $(VENV)/.installed-dev
	$(BIN)/python scripts/compile.py

clean-compiled:
	find trimaran -name '*.so' -delete
	rm -rf build/mypyc

# CI's second run: compile, then the compiled modules' own tests and the protocol suites over them.
COMPILED_TESTS ?= tests/test_compiled.py tests/test_topics.py tests/broker tests/mqtt tests/amqp091 \
	tests/amqp1 tests/runtime/test_frame_order_mqtt.py tests/runtime/test_frame_order_amqp091.py \
	tests/runtime/test_frame_order_amqp1.py tests/runtime/test_deadlines.py tests/queue tests/interop \
	tests/security
test-compiled: compile
	TRIMARAN_REQUIRE_COMPILED=1 $(BIN)/python -m pytest $(COMPILED_TESTS) $(ARGS)

# The release check of the compiled wheel: built by python -m build, installed alone in a fresh venv,
# the same suites run against the installed package (scripts/wheel_suites.py; WHEEL=path checks one).
test-wheel: $(VENV)/.installed-dev
	$(BIN)/python scripts/wheel_suites.py $(if $(WHEEL),--wheel $(WHEEL)) $(COMPILED_TESTS) -- $(ARGS)

# Slow suites too (crash tests, soak).
test-all: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -m "" $(ARGS)

# The release alone (also part of `make test`): build, twine check, the wheel served from a fresh venv,
# and one version on every surface.
release-check: $(VENV)/.installed-dev
	$(BIN)/python -m pytest tests/test_release.py tests/test_version.py $(ARGS)

# The manual (docs/, mkdocs.yml) on http://127.0.0.1:8000, rebuilt as pages change; ARGS for mkdocs.
docs: $(VENV)/.installed-dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve $(ARGS)

# The manual's generated pages (configuration, admin API, openapi.json, changelog) written again under
# docs/ from the code and CHANGELOG.md: the build and tests/test_manual.py fail while they are stale.
manual: $(VENV)/.installed-dev
	$(BIN)/python scripts/manual_pages.py

# The manual as static files in site/, failing on a broken link or a page missing from the nav.
docs-build: $(VENV)/.installed-dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict $(ARGS)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check trimaran tests bench
	$(BIN)/ruff format --check trimaran tests bench

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

check: lint typecheck test

system-deps:
	scripts/system-deps.sh

# The README's performance table in one sitting (bench/README.md; about 35 min, as root, quiet machine):
# installs the peers if missing, prints the table, raw lines in bench/results/. AB="<commit> <commit> ..."
# measures two or more builds against the same peers (REF:interpreted: its source, not its mypyc build, which is built
# and measured otherwise); BENCH_ARGS passes options (--rounds, --rows, --duration, --interpreted ...).
AB ?=
BENCH_ARGS ?=
bench: $(VENV)/.installed-run
	$(BIN)/python bench/run.py --install $(if $(AB),--ab $(AB)) $(BENCH_ARGS)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[compile]'
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	scripts/system-deps.sh
	$(BIN)/pip install --quiet -e '.[dev,postgres,analytics,compile]'
	touch $@ $(VENV)/.installed-run

clean: clean-compiled
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
