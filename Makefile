# make demo: set up .venv (pinned stack) if missing, then compile and verify the tutorial models.
# make test: set up .venv and the ExecuTorch oracle venv, then run the whole test suite.
# make test-any-machine: the numerical tests (marker numerics) once per setting in ANY_MACHINE,
#   each a way another machine sums floats (thread count, ATen's ISA); fails naming the settings that failed.
# make fuzz: the full mutation sweeps (FUZZ_CASES damaged .pte files, then as many damaged Ethos-U payloads
#   through the simulator, then VGF_FUZZ_CASES damaged VGF payloads through the VGF engine), then
#   coverage-guided fuzzing for FUZZ_SECONDS (default 600) in all: half on .pte files, half on Ethos-U payloads
#   through the simulator.
PYTHON ?= python3
VENV := .venv
ORACLE := .venv-oracle
PIP_QUIET := --quiet --disable-pip-version-check
STAMP := $(VENV)/.tosakit-installed
ORACLE_STAMP := $(ORACLE)/.oracle-installed
PYTEST_ARGS ?= -n 2 --dist worksteal

.PHONY: demo test test-any-machine setup oracle bench fuzz clean vulkan browser

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install $(PIP_QUIET) -e '.[test,models,cluster,explore]'
	@$(MAKE) --no-print-directory vulkan browser
	@touch $@

# The VGF engine's two Debian packages (the Vulkan loader, Mesa's software driver): installed when root (CI is),
# else one line says the command. `tosakit doctor` says which engines this machine has.
VULKAN_PACKAGES := libvulkan1 mesa-vulkan-drivers

vulkan:
	@if ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 && ldconfig -p | grep -q libvulkan.so.1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get install -y -qq --no-install-recommends $(VULKAN_PACKAGES) >/dev/null || \
		{ apt-get update -qq && apt-get install -y -qq --no-install-recommends $(VULKAN_PACKAGES) >/dev/null; } || \
		echo "could not install $(VULKAN_PACKAGES): the VGF engine stays off (tosakit doctor)"; \
	else echo "the VGF engine (tosakit run --engine vgf) needs: sudo apt-get install $(VULKAN_PACKAGES)"; fi

# Debian's Chromium, in which the tests render `tosakit inspect --explore`'s Model Explorer page (Playwright drives
# it; WebGL on its SwiftShader): installed when root, else one line says the command.
browser:
	@if [ -x /usr/lib/chromium/chromium ] || command -v chromium >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || \
		{ apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; } || \
		echo "could not install chromium: the Model Explorer rendering test fails (as root)"; \
	else echo "the Model Explorer rendering test needs: sudo apt-get install chromium"; fi

oracle: $(ORACLE_STAMP)

$(ORACLE_STAMP): tests/oracle/requirements.txt
	@test -x $(ORACLE)/bin/python || $(PYTHON) -m venv $(ORACLE)
	$(ORACLE)/bin/pip install $(PIP_QUIET) -r tests/oracle/requirements.txt
	$(ORACLE)/bin/pip install $(PIP_QUIET) --no-deps executorch==1.5.1
	@touch $@

demo: $(STAMP)
	$(VENV)/bin/tosakit demo

test: $(STAMP) $(ORACLE_STAMP)
	TOSAKIT_ORACLE_PYTHON=$(CURDIR)/$(ORACLE)/bin/python $(VENV)/bin/python -m pytest $(PYTEST_ARGS)

ANY_MACHINE ?= OMP_NUM_THREADS=1 OMP_NUM_THREADS=2 OMP_NUM_THREADS=4 ATEN_CPU_CAPABILITY=default

test-any-machine: $(STAMP) $(ORACLE_STAMP)
	@start=$$(date +%s); failed=; \
	for setting in $(ANY_MACHINE); do \
		echo "== $$setting"; t=$$(date +%s); \
		env $$setting TOSAKIT_ORACLE_PYTHON=$(CURDIR)/$(ORACLE)/bin/python \
			$(VENV)/bin/python -m pytest -m numerics -q -p no:cacheprovider $(PYTEST_ARGS) || failed="$$failed $$setting"; \
		echo "== $$setting: $$(($$(date +%s) - t)) s"; \
	done; \
	echo "test-any-machine: $(words $(ANY_MACHINE)) settings in $$(($$(date +%s) - start)) s"; \
	if [ -n "$$failed" ]; then echo "test-any-machine FAILED under:$$failed"; exit 1; fi

FUZZ_SECONDS ?= 600
FUZZ_CASES ?= 8000
VGF_FUZZ_CASES ?= 2000

fuzz: $(STAMP)
	$(VENV)/bin/pip install $(PIP_QUIET) -e '.[fuzz]'
	$(VENV)/bin/python fuzz/sweep.py --cases $(FUZZ_CASES)
	$(VENV)/bin/python fuzz/npu_sweep.py --cases $(FUZZ_CASES)
	$(VENV)/bin/python fuzz/vgf_sweep.py --cases $(VGF_FUZZ_CASES)
	@mkdir -p fuzz/corpus/live fuzz/corpus/npu-live fuzz/findings
	$(VENV)/bin/python fuzz/target.py -max_total_time=$$(($(FUZZ_SECONDS) / 2)) -timeout=60 -rss_limit_mb=3072 \
		-artifact_prefix=fuzz/findings/ fuzz/corpus/live fuzz/corpus/seeds
	$(VENV)/bin/python fuzz/target_npu.py -max_total_time=$$(($(FUZZ_SECONDS) - $(FUZZ_SECONDS) / 2)) -timeout=20 \
		-rss_limit_mb=1024 -artifact_prefix=fuzz/findings/npu- fuzz/corpus/npu-live fuzz/corpus/npu-seeds

bench: $(STAMP)
	$(VENV)/bin/python bench/run.py $(BENCH_ARGS)

# `make bench -- --compare-executorch zoo`: words after `bench` go to bench/run.py, not to make.
ifeq (bench,$(firstword $(MAKECMDGOALS)))
BENCH_ARGS += $(wordlist 2,$(words $(MAKECMDGOALS)),$(MAKECMDGOALS))
$(eval $(wordlist 2,$(words $(MAKECMDGOALS)),$(MAKECMDGOALS)):;@:)
endif

clean:
	rm -rf $(VENV) $(ORACLE) .venv-executorch .pytest_cache build out bench/out
