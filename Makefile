# One entry point for developers and CI. Every target sets up what it needs first.
#   make deploy-eagle3   fresh machine: install everything, then run the main job (GitOps render by default)
#   make test            fresh machine: install everything, then lint, sanity, unit, integration, e2e
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV ?= .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

.PHONY: help setup deploy-eagle3 test lint sanity units integration e2e build changelog-lint cluster-up cluster-down bench clean

help:
	@echo "make deploy-eagle3  set up and render/apply the EAGLE-3 InferenceService (inventories/local)"
	@echo "make test           set up and run every test tier (what .ci/run calls)"
	@echo "make lint | sanity | units | integration | e2e | build | cluster-up | cluster-down | bench"

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

cluster-up: setup
	@$(VENV)/bin/python -m tests.testbed.cli up

cluster-down: setup
	@$(VENV)/bin/python -m tests.testbed.cli down

bench: setup
	@hack/bench.sh

clean:
	rm -rf .build tests/output .pytest_cache
