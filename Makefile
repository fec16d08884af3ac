# kpro.gpu_serving — the project's commands. `make demo` runs the main job against the
# lab; `make test` runs every test. Both set themselves up from a clean clone.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= $(firstword $(wildcard /root/.pyenv/versions/3.12*/bin/python3) $(shell command -v python3.12))
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export UV_PYTHON_DOWNLOADS := never
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
COLL_LINK := .collections/ansible_collections/kpro/gpu_serving

.PHONY: .debian-tools help setup lock sglang-lock check-inventory units units-a units-b core-matrix static sanity lint lab-up lab-down lab-test lab-test-pve9 molecule test demo drill bench build ee-context clean

help:
	@echo "make demo   - set up, bring the lab up, run the migration twice (second run changed=0), lab down"
	@echo "make test   - set up and run every test: units, sanity, ansible-lint, lab tests, molecule"
	@echo "make drill DRILL=<phase>|all - the serve stage against a failure drill in the lab, with its diagnosis"
	@echo "make setup | lock | units | core-matrix | sanity | lint | lab-up | lab-down | lab-test | lab-test-pve9 | molecule | bench | build"
	@echo "  (KPGS_LAB_RELEASE=pve9 make lab-up: a Proxmox VE 9 node; lab-test-pve9: the PVE 9 set, lab-test: all on PVE 8)"
	@echo "make ee-context - the execution environment's build context in .build/ee (meta/execution-environment.yml)"
	@echo "make check-inventory INVENTORY=inventories/kpro [ANSIBLE_ARGS=--ask-vault-pass] - the inventory checked offline"

# The toolchain, pinned with hashes in requirements/dev.lock, installed with uv.
$(VENV)/.synced: requirements/dev.lock
	@command -v uv >/dev/null || python3 -m pip install -q "uv==$$(sed -n 's/^uv==\([^ ]*\).*/\1/p' requirements/dev.lock)"
	@[ -x $(BIN)/python ] || uv venv -q -p "$(PYTHON)" $(VENV)
	VIRTUAL_ENV=$(VENV) uv pip sync -q --require-hashes requirements/dev.lock
	@touch $@

# Debian tools the tests use outside the lab too (the lab's package mirror is indexed with apt-ftparchive).
.debian-tools:
	@command -v apt-ftparchive >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends apt-utils; }
# shellcheck: ansible-test sanity checks the shell scripts with it (it skips them without).
	@command -v shellcheck >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends shellcheck; }
# systemd-analyze: the unit tests verify rendered sglang.service files with the real systemd.
	@command -v systemd-analyze >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd; }
# prometheus, prometheus-node-exporter: test_verify.py runs the real binaries in the lab (lab addresses, ended by PID).
# Their postinsts would start system services (ports 9090/9100 on this machine): a policy-rc.d refusing starts (exit 101,
# what invoke-rc.d and deb-systemd-invoke obey) is in place for this install only, one already there is left alone, and
# under systemd the units the postinsts enabled are disabled (--now: stopped too), so none runs now or after a reboot.
	@command -v prometheus >/dev/null && command -v prometheus-node-exporter >/dev/null || { apt-get update -qq; \
	  p=/usr/sbin/policy-rc.d; [ -e $$p ] || { trap 'rm -f '$$p EXIT; printf '#!/bin/sh\nexit 101\n' >$$p; chmod 755 $$p; }; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus prometheus-node-exporter; \
	  [ ! -d /run/systemd/system ] || systemctl disable -q --now prometheus.service prometheus-node-exporter.service; }

$(COLL_LINK):
	@mkdir -p $(dir $@) && ln -sfn ../../.. $@

setup: $(VENV)/.synced $(COLL_LINK) .debian-tools

lock:
	uv pip compile requirements/dev.in --python "$(PYTHON)" --generate-hashes -q -o requirements/dev.lock
	$(foreach m,$(CORE_MINORS),uv pip compile requirements/core-$(m).in --python "$(PYTHON)" --generate-hashes -q -o requirements/core-$(m).lock;)

# The inventory, checked offline before a run (playbooks/check-inventory.yml: on the controller only, it contacts no
# host): every input of every host, all problems in one run. Needs only the venv, not the test tools.
#   make check-inventory INVENTORY=inventories/kpro ANSIBLE_ARGS=--ask-vault-pass
INVENTORY ?= inventories/lab
ANSIBLE_ARGS ?=
check-inventory: $(VENV)/.synced $(COLL_LINK)
	$(BIN)/ansible-playbook -i $(INVENTORY) playbooks/check-inventory.yml $(ANSIBLE_ARGS)

units: setup
	$(BIN)/python -m pytest -q tests/unit

# make test runs the unit tests as two halves beside the static checks (make -j): none of the three uses the lab, and
# on 2 cores they take about half as long side by side as one after the other. units-b is every unit test that
# units-a does not run, so a new test directory is never left out.
UNITS_A := tests/unit/plugins/modules tests/unit/roles tests/unit/test_fleet_inventory.py tests/unit/test_packaging.py
units-a: setup
	$(BIN)/python -m pytest -q $(UNITS_A)

units-b: setup
	$(BIN)/python -m pytest -q tests/unit $(addprefix --ignore=,$(UNITS_A))

# Every ansible-core minor meta/runtime.yml declares, other than the dev lock's 2.21, in its own venv from
# requirements/core-<minor>.lock: ansible-doc renders every plugin and documented role (tests/tools/plugin_docs.py),
# then a reduced unit set, tests/unit/plugins/module_utils (no lab, no dev toolchain); sanity, lint and the other unit
# tests run on 2.21 only. About 2 min; pytest's exit 5 (nothing collected) fails it like any other.
CORE_MINORS := 2.20
CORE_UNITS := tests/unit/plugins/module_utils
# The ansible-core venvs live outside the checkout: what they install (ansible-core's own tools) is not the collection's
# code, and the tree's scans must not read it. One per minor, shared by the clones of this machine (uv syncs it to the
# lock each time).
CORE_ROOT ?= $(HOME)/.cache/kpro-gpu-serving/ansible-core
$(CORE_ROOT)-%/.synced: requirements/core-%.lock $(VENV)/.synced
	@[ -x $(CORE_ROOT)-$*/bin/python ] || uv venv -q -p "$(PYTHON)" $(CORE_ROOT)-$*
	VIRTUAL_ENV=$(CORE_ROOT)-$* uv pip sync -q --require-hashes $<
	@touch $@

core-matrix: $(foreach m,$(CORE_MINORS),$(CORE_ROOT)-$(m)/.synced) $(COLL_LINK)
	for m in $(CORE_MINORS); do $(CORE_ROOT)-$$m/bin/python tests/tools/plugin_docs.py; \
	  $(CORE_ROOT)-$$m/bin/python -m pytest -q $(CORE_UNITS); done

static: setup
	tests/tools/sanity.sh
	$(BIN)/ansible-lint --profile production

sanity: setup
	tests/tools/sanity.sh

lint: setup
	$(BIN)/ansible-lint --profile production

# One lab at a time on a machine (its namespaces and addresses are global): every target that uses the lab runs under
# the lab's lock (tests/tools/lablock.py: flock on /tmp/kpgs-lab.lock; a command already under it goes on at once).
LABLOCK := $(BIN)/python tests/tools/lablock.py

lab-up: setup
	$(LABLOCK) $(BIN)/python tests/lab/labctl.py up

lab-down: setup
	$(LABLOCK) $(BIN)/python tests/lab/labctl.py down

lab-test: setup
	$(LABLOCK) $(BIN)/python -m pytest -q tests/lab_tests --durations=15

# Proxmox VE 9 (labctl.py up --release pve9: Debian 13 trixie, kernel 6.17): make test runs every lab test on PVE 8
# (lab-test) and this reduced set on PVE 9: the stock host's converge, the reboot and the kernel upgrade without
# headers (test_reboot.py), the driver's kernel bound. The long ones (kernel upgrade, rollback, serve safety, two
# nodes, ...) and molecule run on PVE 8 only.
LAB_TESTS_PVE9 := tests/lab_tests/test_stock_host.py tests/lab_tests/test_reboot.py tests/lab_tests/test_driver_kernel_support.py
lab-test-pve9: setup
	KPGS_LAB_RELEASE=pve9 $(LABLOCK) $(BIN)/python -m pytest -q $(LAB_TESTS_PVE9) --durations=5

molecule: setup
	$(LABLOCK) tests/tools/molecule.sh

# The lab tests and molecule share the one lab, so they run one after the other, after the rest (PVE 9's set first:
# the PVE 8 session after it resets the node to PVE 8). -Otarget prints each parallel job's output whole when it ends.
test: setup
	$(MAKE) --no-print-directory -j3 -Otarget units-a units-b static core-matrix
	$(MAKE) --no-print-directory lab-test-pve9 lab-test molecule

demo: setup
	$(LABLOCK) tests/tools/demo.sh

# One catalogue failure (or all) against the lab's serve stage, with the diagnosis: make drill DRILL=kv_cache_oom
DRILL ?= all
drill: setup
	$(LABLOCK) $(BIN)/python tests/tools/drill.py $(DRILL)

bench: setup
	$(BIN)/python tests/bench/bench_gate.py --runs 5
	$(LABLOCK) $(BIN)/python tests/bench/bench_noop.py --runs 3
	$(LABLOCK) $(BIN)/python tests/bench/bench_pct.py --runs 3
	$(LABLOCK) $(BIN)/python tests/bench/bench_peer.py

# Regenerate the SGLang lock for the container (real index): make sglang-lock SGLANG_VERSION=0.5.11 PYVER=3.11
sglang-lock: setup
	roles/sglang_install/files/locks/regenerate.sh "$(SGLANG_VERSION)" "$(PYVER)"

build: setup
	mkdir -p .build && ansible-galaxy collection build --force --output-path .build .

# The execution environment's build context in .build/ee (then: podman build .build/ee, or ansible-builder build).
ee-context: setup
	ansible-builder create -f meta/execution-environment.yml -c .build/ee --output-filename Containerfile

clean: lab-down
	rm -rf .build $(VENV) .collections $(foreach m,$(CORE_MINORS),$(CORE_ROOT)-$(m))
