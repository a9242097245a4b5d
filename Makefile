# grpo-deploy: `make help` lists the targets.
PYTHON ?= python3
PYTEST_ARGS ?=
BENCH_REPEAT ?= 3
# make test: what it leaves out, and the tiers without Docker that run on parallel workers (pytest-xdist)
TEST_MARKS := not gpu and not arm64_switches
FAST_TIERS := tests/unit tests/static tests/hostile
FAST_WORKERS ?= 2

.DEFAULT_GOAL := help
.PHONY: help setup demo test test-gpu test-verl test-verl-cluster test-trainer-hosts test-replicas-hosts test-split-hosts ci-fresh test-cuda-images test-arm64-images test-arm64-switches test-unit test-static test-integration images images-cuda images-static bench bench-forecast bench-shipping bench-split bench-cluster bench-proxy bench-tune-paired bench-watcher render-defaults docs clean

help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  make %-20s %s\n", $$1, $$2}'

setup: ## install what the kit needs on a fresh machine (Docker engine, Compose plugin, Python packages)
	bash scripts/setup.sh

demo: setup ## THE MAIN JOB: the CPU rehearsal (real vLLM server + real TRL async trainer) on this machine
	grpo-deploy up --fresh

test: setup ## run every test this machine can run (unit, static, integration and faults with real containers and two-host SSH test hosts, the verl rehearsal, the verl cluster and a real tune; the CUDA image builds when their inputs changed); left out: GPU runs and the arm64 switches under QEMU
	@# Two sessions: the fast tiers (no Docker) on two workers side by side (2:21 against ~4:30 in one), then the
	@# rest one test at a time (they share an engine, test hosts and the cores). Both run; either failing fails it.
	rm -f build/ci-phases.json; rc=0; \
	GRPO_NO_SKIPS=1 $(PYTHON) -m pytest -n $(FAST_WORKERS) $(FAST_TIERS) -m "$(TEST_MARKS)" -q -rs $(PYTEST_ARGS) || rc=$$?; \
	GRPO_NO_SKIPS=1 GRPO_CI_PHASES_APPEND=1 $(PYTHON) -m pytest $(addprefix --ignore=,$(FAST_TIERS)) -m "$(TEST_MARKS)" \
	  -rs --durations=30 $(PYTEST_ARGS) || rc=$$?; \
	exit $$rc

test-gpu: ## on ONE NVIDIA GPU, no Docker (vLLM, TRL and the kit importable; the gpu pack of ../shared/tools/gpu-pack carries them): the harness renders a one-GPU spec and runs both roles from the rendered files, the rehearsal task (40 steps) and seed 004's recipe shape (20 steps); GRPO_GPU_OUT keeps the report
	$(PYTHON) -m pytest -m gpu tests/gpu -rs $(PYTEST_ARGS)

test-cuda-images: setup ## the air-gapped x86_64 CUDA server and trainer images built and checked (~8 min cold, the 3.8 GB wheel download included); run it when `make test` says their inputs changed: it records images/cuda/amd64-verified.txt (commit it)
	GRPO_NO_SKIPS=1 GRPO_IMAGE_TESTS=always $(PYTHON) -m pytest -m amd64_build tests/integration/test_cuda_images.py -rs $(PYTEST_ARGS)
	$(PYTHON) -m tests.image_records --record amd64

test-arm64-images: setup ## the arm64 (DGX Spark) CUDA images built under QEMU and checked (~25 min); run it when `make test` says their inputs changed: it records images/cuda/arm64-verified.txt (commit it)
	GRPO_NO_SKIPS=1 GRPO_IMAGE_TESTS=always $(PYTHON) -m pytest -m arm64_build tests/integration/test_cuda_images.py -rs $(PYTEST_ARGS)
	$(PYTHON) -m tests.image_records --record arm64

test-arm64-switches: setup ## the trainer speed switches (bench trainer --tiny, every switch) inside the arm64 trainer image under QEMU (builds the image when missing, ~25 min; not in make test); records images/cuda/arm64-switches.txt (commit it)
	GRPO_NO_SKIPS=1 nice -n 19 $(PYTHON) -m pytest -m arm64_switches tests/integration/test_arm64_switches.py -rs $(PYTEST_ARGS)
	$(PYTHON) -m tests.arm64_switches --record

test-unit: ## unit tests only (no Docker)
	$(PYTHON) -m pytest tests/unit -m "not gpu" -q

test-static: ## static validation: compose, Dockerfiles, Kubernetes overlays, Ansible, YAML
	$(PYTHON) -m pytest tests/static -q

test-verl: setup ## the real verl rehearsal through `up` (verl + Ray + vLLM CPU + LoRA) on seed 000's disk: plan and preflight refuse the seed's config; the watchdog stops a full disk and the resume (~4 min; also in make test)
	GRPO_NO_SKIPS=1 $(PYTHON) -m pytest -m verl_rehearsal tests/faults/test_verl_replay.py -rs $(PYTEST_ARGS)

test-verl-cluster: setup ## verl across two SSH test hosts: a Ray cluster trains 12 steps through a worker kill and a head kill, then the cluster refusals (~10-13 min; also in make test)
	GRPO_NO_SKIPS=1 $(PYTHON) -m pytest -m verl_cluster tests/faults/test_verl_cluster.py -rs $(PYTEST_ARGS)

test-replicas-hosts: setup ## trl-async with a vLLM replica on each of two SSH test hosts behind the replica proxy, 16 steps (about 4 min; also in make test)
	GRPO_NO_SKIPS=1 $(PYTHON) -m pytest -m replicas_hosts tests/integration/test_replicas_hosts.py -rs $(PYTEST_ARGS)

test-trainer-hosts: setup ## trl-async with the trainer over two SSH test hosts (one FSDP2 group over gloo, machine 0 beside the server), machine 1 SIGKILLed and both resumed, then one host refused on its checkpoints
	GRPO_NO_SKIPS=1 $(PYTHON) -m pytest -m trainer_hosts tests/faults/test_trainer_hosts.py -rs $(PYTEST_ARGS)

test-split-hosts: setup ## the split rehearsal over two SSH test hosts (server on spark2, trainer on spark1) through a server SIGKILL on its host, restarted over SSH, the trainer resumed; then the two-host refusals (~6 min; also in make test)
	GRPO_NO_SKIPS=1 $(PYTHON) -m pytest tests/faults/test_server_kill_split.py tests/integration/test_multihost.py -rs $(PYTEST_ARGS)

test-integration: ## the real rehearsal in containers, the seed-004 preflight refusal
	$(PYTHON) -m pytest tests/integration -q

images: ## build the cpu image (debootstrap base, host wheelhouse, --no-index install; no registry needed)
	grpo-deploy images build cpu

images-cuda: ## build and check the air-gapped x86_64 CUDA server and trainer images (about 4 GB of wheels, no GPU needed)
	grpo-deploy images build cuda-server-amd64 cuda-trainer-amd64
	grpo-deploy images verify cuda-server-amd64 cuda-trainer-amd64

images-static: ## hadolint every Dockerfile (GPU images cannot be built here)
	grpo-deploy images lint

bench: ## start-up ratio and hand-off of the rehearsal (needs `make demo`; BENCH_REPEAT bare server starts, CI: 1); preflight over 2 and 8 test hosts; the watcher's alarms (~2 min; plan's forecast against a rerun is `make bench-forecast`)
	$(PYTHON) benchmarks/rehearsal_startup.py --repeat '$(BENCH_REPEAT)'
	$(PYTHON) benchmarks/multihost.py --part preflight
	$(PYTHON) benchmarks/watcher_alarms.py

bench-forecast: ## plan's forecast of a rerun of the rehearsal (from `make demo`'s metrics) against what the rerun takes (~5 min)
	$(PYTHON) benchmarks/forecast_error.py

bench-shipping: ## image shipping over SSH to a test host: without the image, again, after a code-only change (~7 min)
	$(PYTHON) benchmarks/multihost.py --part shipping

bench-split: ## split `up` -> first step over two test hosts against the local one (minutes)
	$(PYTHON) benchmarks/multihost.py --part split

bench-cluster: ## verl's Ray cluster up (head to every worker joined) over 2 and 4 test hosts, each held to 0.4 CPUs as separate machines (ships the verl-cpu image to 4 hosts: ~15 min cold)
	$(PYTHON) benchmarks/multihost.py --part cluster

bench-proxy: ## the replica proxy's overhead per completion request against a direct request to a fake replica (target: median under 2 ms; ~1 min)
	$(PYTHON) benchmarks/proxy_overhead.py

bench-tune-paired: ## after `grpo-deploy tune --apply`: the tuned spec against the spec before it, 3 interleaved pairs of real runs, wall time to a 5-step mean reward of TARGET (default 0.5) and the line's estimate at half-way (SPEC=grpo-deploy.yaml)
	$(PYTHON) benchmarks/tune_paired.py --before $(or $(SPEC),grpo-deploy.yaml).before-tune --after $(or $(SPEC),grpo-deploy.yaml) --target $(or $(TARGET),0.5)

bench-watcher: ## the run watcher's plateau alarm on 1,000 seeded seed-shaped streams: false alarms on rising ones (target under 1%), detection delay, seed 000's curve, three window sizes; then across per-step noise 0.02-0.12 and binary answers: false alarms on rising and slow-rising streams (target at most 1 in 20), plateau delay (target p95 at most 2.5 windows at 0.05) (~1.5 min)
	$(PYTHON) benchmarks/watcher_alarms.py

ci-fresh: ## rehearse CI as a fresh machine runs it: a fresh clone of HEAD against an empty second Docker engine (own namespaces; this engine's images untouched); run before every stop (root, ~60 min)
	bash scripts/fresh-engine-ci.sh

docs: ## rewrite the generated reference pages (docs/reference/) and build the documentation site into build/site
	$(PYTHON) -m grpo_deploy.docs_reference
	$(PYTHON) -m mkdocs build --strict -d build/site

render-defaults: ## rewrite the committed renders: compose/.env, compose/rendered/, k8s/*/generated/
	$(PYTHON) -m grpo_deploy.render.committed

clean: ## remove local run state and build outputs (not Docker images or volumes)
	rm -rf .grpo-deploy build
