# rubick — build, test, lint, demo, bench. `make test` and `make demo` set up a fresh
# machine themselves (system packages via apt when run as root).

CARGO ?= cargo
# One shared target directory: reuse $CARGO_TARGET_DIR when set (CI keeps one outside
# the clone), else ./target.
export CARGO_TARGET_DIR ?= $(CURDIR)/target
BIN := $(CARGO_TARGET_DIR)/debug

.PHONY: all setup build test lint demo bench fuzz install schemas clean

all: build

# HiGHS (the MILP solver) is built from C++ source: it needs cmake, g++ and libclang.
setup:
	@missing=""; \
	command -v cmake >/dev/null 2>&1 || missing="$$missing cmake"; \
	command -v g++ >/dev/null 2>&1 || missing="$$missing g++"; \
	ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 || ls /usr/lib/*/libclang-[0-9]*.so* >/dev/null 2>&1 || missing="$$missing libclang-dev"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "setup: installing$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "setup: missing system packages:$$missing (install them, e.g. apt-get install$$missing)" >&2; exit 2; \
	  fi; \
	fi

build: setup
	$(CARGO) build --workspace --locked

# The PyTorch reference workload's virtual environment (reused from /var/tmp when
# present; a fresh machine installs torch, ~3 GB): the real-profile tests use it. When
# it, a Slurm or the reference data is missing, the tests that need it skip, saying why,
# and the list is printed at the end; under CI=true (or RUBICK_REQUIRE_*=1) they fail
# instead (tests/src/needs.rs). The integration tests run the tools' binaries: built
# first, since cargo builds a package's binaries only for its own integration tests.
# python/tests run against this checkout's package as pip installs it (py.typed and
# all), built into a temporary directory of this run: the venv is shared by every
# clone on the machine, so nothing of one checkout is installed into it (with an
# install there, two clones testing at once would each test whichever installed last).
test: setup
	@venv=$$(scripts/python-env.sh) && export RUBICK_VENV="$$venv" || \
	  echo "test: no PyTorch environment (scripts/python-env.sh failed); its tests skip" >&2; \
	skipped=$$(mktemp) && export RUBICK_SKIPPED="$$skipped"; \
	$(CARGO) build --workspace --bins --locked && $(CARGO) test --workspace --locked; rc=$$?; \
	if [ -n "$${RUBICK_VENV:-}" ] && "$$RUBICK_VENV/bin/python" -c 'import pytest' 2>/dev/null; then \
	  package=$$(mktemp -d) && mkdir "$$package/src" && \
	  cp -r python/pyproject.toml python/README.md python/rubick "$$package/src/" && \
	  "$$RUBICK_VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
	    --no-index --target "$$package/lib" "$$package/src" && \
	  PYTHONPATH="$$package/lib" "$$RUBICK_VENV/bin/python" -m pytest -q -p no:cacheprovider python/tests || rc=1; \
	  rm -rf "$$package"; \
	elif [ "$${RUBICK_REQUIRE_PYTORCH:-}" = 1 ] || { [ "$${CI:-}" = true ] && [ "$${RUBICK_REQUIRE_PYTORCH:-}" != 0 ]; }; then \
	  echo "test: PyTorch is required here (CI=true or RUBICK_REQUIRE_PYTORCH=1) but no venv with pytest for python/tests" >&2; rc=1; \
	else \
	  echo "python/tests: no virtual environment with pytest (scripts/python-env.sh)" >> "$$skipped"; \
	fi; \
	if [ -s "$$skipped" ]; then \
	  echo "test: $$(sort -u "$$skipped" | wc -l) test(s) did not run what they test:" >&2; \
	  sort -u "$$skipped" | sed 's/^/  /' >&2; \
	fi; rm -f "$$skipped"; exit $$rc

# python/ is linted with ruff and type-checked with mypy (strict; python/pyproject.toml)
# from the venv of scripts/python-env.sh; without one it is skipped, saying so (CI
# requires it: RUBICK_REQUIRE_PYTORCH=1).
lint: setup
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	@if venv=$$(scripts/python-env.sh); then \
	  cd python && set -x && "$$venv/bin/ruff" check . && "$$venv/bin/ruff" format --check . && "$$venv/bin/mypy"; \
	elif [ "$${RUBICK_REQUIRE_PYTORCH:-}" = 1 ]; then \
	  echo "lint: RUBICK_REQUIRE_PYTORCH=1 but scripts/python-env.sh failed: python/ cannot be linted" >&2; exit 1; \
	else \
	  echo "lint: no Python environment (scripts/python-env.sh failed): python/ is not linted (ruff, mypy)" >&2; \
	fi

# The main job on the embedded local default: first a real profile of the PyTorch
# reference workload on this machine's CPU or GPUs, of the 8 configurations the
# selection rule chooses (out/demo-configs.csv, out/demo-profile.csv) and its fitted
# model (out/demo-pytorch-model.yaml); then one scheduling round for the seven
# example jobs on the paper's 8 x 8 A800 testbed (schedule in out/, the per-job
# explanation on stderr), their resource sensitivity curves (out/demo-curves.png) and
# plan spaces (out/demo-space.csv). When the authors' reference data is beside the
# checkout, the jobs' performance models are fitted on it, and the model of LLaMA-2-7B
# is evaluated too (out/demo-llama7-summary.yaml and .svg), and the authors' 10-job
# trace is simulated under Rubick and a static queue (out/demo-sim-*). Last, rubick-run
# drives two copies of the PyTorch workload through rounds of rubick-plan on this
# machine (one stopped; the planner then decides whether the other takes both worker
# slots, and says why) and prints its status.
REFERENCE ?= $(or $(RUBICK_REFERENCE),../shared/reference/rubick-artifact)
demo: build
	@mkdir -p out
	@echo "# a real profile of the PyTorch reference workload on this machine (examples/pytorch/), then its fit" >&2
	@venv=$$(scripts/python-env.sh) && set -x && \
	$(BIN)/rubick-profile devices --cluster-out out/local.yaml >/dev/null && \
	$(BIN)/rubick-fit select --job examples/pytorch/job.yaml --cluster out/local.yaml --budget 8 \
	  -o out/demo-configs.csv && \
	PATH="$$venv/bin:$$PATH" $(BIN)/rubick-profile run examples/pytorch/job.yaml --cluster out/local.yaml \
	  --configs out/demo-configs.csv --fresh -o out/demo-profile.csv && \
	$(BIN)/rubick-fit fit out/demo-profile.csv --job examples/pytorch/job.yaml --cluster out/local.yaml \
	  -o out/demo-pytorch-model.yaml
	@if [ -f "$(REFERENCE)/models.yaml" ]; then ref="--reference $(REFERENCE)"; else \
	  ref=""; echo "demo: $(REFERENCE) is absent (the authors' data: README, \"Reference data\"; point RUBICK_REFERENCE at it): the example jobs are planned on performance models guessed from their FLOPs (one warning per command)" >&2; fi; \
	set -x; \
	$(BIN)/rubick-plan schedule --cluster data/cluster-a800-8x8.yaml --jobs data/jobs-paper.yaml $$ref --explain -o out/demo-round0.yaml && \
	$(BIN)/rubick-plan schedule --cluster data/cluster-a800-8x8.yaml --jobs data/jobs-paper.yaml $$ref --current out/demo-round0.yaml --policy rubick-milp --explain -o out/demo-round1.yaml && \
	$(BIN)/rubick-plan curves data/jobs-paper.yaml --cluster data/cluster-a800-8x8.yaml $$ref -o out/demo-curves.csv --plot out/demo-curves.png && \
	$(BIN)/rubick-plan space data/jobs-paper.yaml --cluster data/cluster-a800-8x8.yaml --gpus 8 -o out/demo-space.csv
	@if [ -f "$(REFERENCE)/models.yaml" ]; then \
	  echo "# a short simulation: the authors' 10-job trace under Rubick and a static FIFO queue; plots in out/demo-sim-*/" >&2; \
	  for p in rubick static; do \
	    $(BIN)/rubick-plan simulate --cluster data/cluster-a800-8x8.yaml --reference "$(REFERENCE)" \
	      --trace "$(REFERENCE)/workloads/naive.csv" --policy $$p --summary out/demo-sim-$$p.yaml \
	      --jobs-out out/demo-sim-$$p.csv --plot-dir out/demo-sim-$$p || exit 1; \
	  done; \
	  $(BIN)/rubick-plan compare out/demo-sim-rubick.yaml out/demo-sim-static.yaml --plot out/demo-sim-jct-cdf.png; \
	  echo "# fitted performance model of llama7 (8 profiled rows); summary: out/demo-llama7-summary.yaml, plot: out/demo-llama7.svg" >&2; \
	  $(BIN)/rubick-fit evaluate --reference "$(REFERENCE)" --model llama7 --cluster data/cluster-a800-8x8.yaml \
	    --samples 8 --summary out/demo-llama7-summary.yaml --plot out/demo-llama7.svg --model-out out/demo-llama7-model.yaml; \
	fi
	@echo "# rubick-run: two copies of the PyTorch workload on the local backend, a round of rubick-plan each time (the cron loop); one stopped, then the planner decides whether the other takes both slots (the last line says what it did and why)" >&2
	@scripts/demo-run.sh $(BIN) "$$(scripts/python-env.sh)" out/local.yaml out/demo-pytorch-model.yaml out
	@echo "demo: schedules out/demo-round0.yaml, out/demo-round1.yaml; curves out/demo-curves.png; rubick-run state out/demo-run/dir" >&2

bench: setup
	$(CARGO) bench -p rubick-plan --locked --bench rubick
	$(CARGO) bench -p rubick-fit --locked --bench fit
	@venv=$$(scripts/python-env.sh) && export RUBICK_VENV="$$venv"; \
	$(CARGO) bench -p rubick-profile --locked --bench profile
	$(CARGO) bench -p rubick-run --locked --bench run
	@venv=$$(scripts/python-env.sh) && export RUBICK_VENV="$$venv"; \
	$(CARGO) bench -p rubick-run --locked --bench checkpoint
	$(CARGO) build --release --workspace --bins --locked
	FUZZ_CASES=50000 $(CARGO) test --release -p rubick-tests --test it --locked -- --nocapture fuzz:: | grep '^bench:'

# The fuzzing harness's long run (tests/it/fuzz.rs; `make test` runs 2,000 cases of
# each): mutated artifacts through every parser and their consumers, a million cases;
# mutated states (state.yaml, its cache, pid files) through every rubick-run command
# beside live decoy processes that must survive, 100,000 cases (tests/it/fuzz/state.rs).
FUZZ_CASES ?= 1000000
FUZZ_STATE_CASES ?= 100000
fuzz: setup
	$(CARGO) build --workspace --bins --locked
	FUZZ_CASES=$(FUZZ_CASES) FUZZ_STATE_CASES=$(FUZZ_STATE_CASES) $(CARGO) test -p rubick-tests --test it --locked -- --nocapture fuzz::

# The tools (release), their man pages and shell completions under $(PREFIX)
# (DESTDIR for packaging).
PREFIX ?= /usr/local
TOOLS := rubick-plan rubick-fit rubick-profile rubick-run
install: setup
	$(CARGO) build --release --workspace --bins --locked --exclude rubick-run
	@# rubick-run on its own: built with the rest, its dependencies would take the features
	@# polars asks of them (regex's Unicode tables and engines, through tracing's filter):
	@# 11 MB stripped instead of 6.5.
	$(CARGO) build --release -p rubick-run --locked
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1 \
	  $(DESTDIR)$(PREFIX)/share/bash-completion/completions $(DESTDIR)$(PREFIX)/share/zsh/site-functions \
	  $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d
	@set -e; for t in $(TOOLS); do \
	  bin=$(CARGO_TARGET_DIR)/release/$$t; \
	  install -m 755 $$bin $(DESTDIR)$(PREFIX)/bin/; \
	  $$bin man --out-dir $(DESTDIR)$(PREFIX)/share/man/man1; \
	  $$bin completions bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/$$t; \
	  $$bin completions zsh > $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_$$t; \
	  $$bin completions fish > $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/$$t.fish; \
	  echo "installed $$t"; \
	done

# Rewrite the committed JSON Schemas after changing an artifact type.
schemas:
	RUBICK_UPDATE_SCHEMAS=1 $(CARGO) test -p rubick-tests --locked --test it committed_schemas_match_the_types

clean:
	$(CARGO) clean
