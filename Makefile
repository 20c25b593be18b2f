# make test  - create .venv if needed, install, run the tests (what CI runs)
# make test-fast - the main venv's tests without those marked slow (for developers; CI runs make test)
# make demo  - the embedded default end to end: demos, a tiny WAM trained on the CPU, evaluation, report
# make demo-world-model - make demo, then a world model trained on failures too ranks 7 policies against the simulator
# make docs  - regenerate docs/reference/ from the code and build the site into build/site (strict)
# bash: test-suites reads PIPESTATUS
SHELL       := bash
VENV        ?= .venv
EXTRAS      ?= metaworld,train,ray,dev,interop,docs
# Simulators whose MuJoCo pins clash with Meta-World's get a venv each (.venv-<name>);
# `make test SUITE_VENVS=` skips them.
SUITE_VENVS ?= robosuite libero maniskill
# LIBERO's venv also gets the real vla-eval (its runner drives wam_gym.serve with vla-eval's own LIBERO benchmark)
# and the model stack (a LingBot-VA release evaluates there through the broker).
SUITE_EXTRAS_libero := ,interop,model
PYTEST_ARGS ?=
DEMO_DIR    ?= outputs/demo

.PHONY: install test test-main test-fast suite-venvs deepspeed-ops test-suites test-late demo demo-world-model docs list-envs bench clean

$(VENV)/.installed: pyproject.toml scripts/install.sh
	scripts/install.sh $(VENV) $(EXTRAS)
	touch $@

install: $(VENV)/.installed

# Three lines of work side by side on the machine's two cores: the main venv's tests; DeepSpeed's CPU ops compiling
# (the ZeRO-offload test would otherwise compile them inside the tests' time, ~2.5 min); the simulators' and
# openpi-client's venvs installing, then the simulators' tests (their lines prefixed with the venv's name), then
# the main tests named in MAIN_LATE (prefixed [late]), which balance the two lines (the main tests alone are the longer line).
test:
	$(MAKE) -j3 test-main deepspeed-ops test-late MAIN_LATE="tests/test_docs.py tests/test_cli_walk.py tests/test_demo.py"

MAIN_LATE ?=
test-main: $(VENV)/.installed
	$(VENV)/bin/python -m pytest $(MAIN_LATE:%=--ignore=%) $(PYTEST_ARGS)

test-late: test-suites
	@$(if $(strip $(MAIN_LATE)),$(VENV)/bin/python -m pytest $(MAIN_LATE) $(PYTEST_ARGS) 2>&1 | sed -u "s/^/[late] /"; \
	  test $${PIPESTATUS[0]} -eq 0)

test-fast: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -m "not slow" $(PYTEST_ARGS)

suite-venvs: $(SUITE_VENVS:%=.venv-%/.installed)

.venv-%/.installed: pyproject.toml scripts/install.sh
	scripts/install.sh .venv-$* $*,dev$(SUITE_EXTRAS_$*)
	touch $@

.venv-openpi/.installed: scripts/install_openpi_client.sh
	scripts/install_openpi_client.sh .venv-openpi

deepspeed-ops: $(VENV)/.installed
	$(VENV)/bin/python scripts/build_deepspeed_ops.py

# The LIBERO suite evaluates against python -m wam_gym.serve run from $(VENV), and drives it with openpi-client.
test-suites: suite-venvs $(VENV)/.installed .venv-openpi/.installed
	@for s in $(SUITE_VENVS); do \
	  .venv-$$s/bin/python -m pytest tests/suites/test_$$s*.py $(PYTEST_ARGS) 2>&1 | sed -u "s/^/[$$s] /"; \
	  test $${PIPESTATUS[0]} -eq 0 || exit 1; \
	done

docs: $(VENV)/.installed
	$(VENV)/bin/python scripts/gen_docs.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

list-envs: $(VENV)/.installed
	$(VENV)/bin/python -m wam_gym.envs list

bench: $(VENV)/.installed
	$(VENV)/bin/python bench/vector_env.py
	$(VENV)/bin/python bench/inference.py
	$(VENV)/bin/python bench/broker.py
	$(VENV)/bin/python bench/serve.py

demo: $(VENV)/.installed
	MUJOCO_GL=$${MUJOCO_GL:-egl} $(VENV)/bin/python -m wam_gym.demo --output $(DEMO_DIR)

demo-world-model: $(VENV)/.installed
	MUJOCO_GL=$${MUJOCO_GL:-egl} $(VENV)/bin/python -m wam_gym.demo --world-model --output $(DEMO_DIR)

clean:
	rm -rf $(VENV) .venv-* .pytest_cache
