# Every target runs in .venv/ (made by `make install`, or on first use by test and demo).
PY      ?= python3
VENV    := .venv
PYTHON  := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
RUNS    ?= results/runs
NET     ?= 10gbit

.PHONY: install test test-fast demo figures bench bench-models bench-network bench-ddp-network bench-study-pilot gpu-check wheelhouse reproduce-cpu reproduce-cpu-full reproduce-cpu-long study study-status clean-demo check-claims kick-the-tires help

# `make help` lists every target that has a `## ` comment on its own line, with that comment.
help: ## This list
	@awk -F ':.*## ' '/^[a-z][a-z-]*:.*## / {printf "  %-20s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# pyproject.toml asks for ranges (torch>=2.1, ...); constraints.txt pins the tested versions.
# pip installs only uv (pinned too); uv installs the rest: it fetches and unpacks the 5.5 GB of
# torch + CUDA wheels in parallel, where pip takes one wheel at a time (a fresh venv here:
# pip 98 s, uv 55 s). uv reads no pip.conf: a private index is given to it as UV_INDEX_URL or
# UV_FIND_LINKS. Its cache lives in .venv/ so that it hard-links into the venv (no second copy
# on disk) and goes with it. uv, like pip --no-compile, writes no bytecode; compileall does, on
# every core (the whole install took 124 s with pip compiling, 109 s with compileall). It compiles
# this repository's own modules too, which nothing else would cache where
# PYTHONDONTWRITEBYTECODE is set (this project's CI machines set it): each process of a run, each
# rank, compiled them again. A file some package ships that does not compile stays uncompiled,
# as pip leaves it; one of this repository's stops the install.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PYTHON) -m pip install --quiet -c constraints.txt uv
	UV_CACHE_DIR=$(VENV)/.uv-cache $(VENV)/bin/uv pip install --quiet --python $(PYTHON) \
		-c constraints.txt -e '.[suite,test]'
	@$(PYTHON) -m compileall -qq -j 0 accordion_repro benchmarks tests
	@$(PYTHON) -m compileall -qq -j 0 \
		"$$($(PYTHON) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || true
	@touch $(STAMP)

install: $(STAMP) ## Make .venv/ with the pinned versions (constraints.txt)

# Two workers, each test file whole on one of them (its module fixtures are built once), the
# longest files first (tests/conftest.py): the suite mostly waits on subprocesses and daemons,
# so two workers use both cores. At the end it lists any test over 3 s of CPU (its process and
# children, a measure load barely changes) that lacks the `slow` marker `test-fast` leaves out.
PYTEST  := $(PYTHON) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

test: $(STAMP) ## The whole suite, slow tests included (two workers)
	$(PYTEST)

test-fast: $(STAMP) ## The suite without the tests marked slow
	$(PYTEST) -m "not slow"

# Two gloo ranks train ResNet-18 at quarter width on the offline synthetic CIFAR-10
# for 8 short epochs (24 steps of 32 images per rank each, no warm-up): enough to learn (45 % test
# accuracy, chance is 10 %) and for the detector (a check every epoch) to move layers between
# rank 2 and rank 1 between the LR decays, which fall on epochs 4 and 7. About 90 s of CPU
# (user + sys) in all. Each demo starts afresh in DEMO_DIR (trainer.resume=never moves the
# previous one into DEMO_DIR/.replaced/); `make clean-demo` deletes them all.
DEMO_STEPS ?= 24
DEMO_DIR ?= results/demo
DEMO_ARGS = model=resnet18 model.width=0.25 dataset=synthetic_cifar10 compressor=powersgd \
	schedule=accordion schedule.interval=1 dist.nproc_per_node=2 trainer.epochs=8 \
	trainer.batch_size=32 trainer.max_steps_per_epoch=$(DEMO_STEPS) trainer.max_eval_steps=4 \
	optim.warmup_epochs=0 logger.wandb.mode=offline trainer.progress=always run.name=demo \
	trainer.resume=never hydra.run.dir=$(DEMO_DIR)
demo: $(STAMP) ## Two gloo ranks train ResNet-18 with Accordion for 8 short epochs
	$(PYTHON) -m accordion_repro.train $(DEMO_ARGS)

clean-demo: ## Delete every demo run under DEMO_DIR
	rm -rf $(DEMO_DIR)

figures: $(STAMP) ## Tables and figures from RUNS [RUNS=dir NET=10gbit]
	$(PYTHON) -m accordion_repro.analysis --runs $(RUNS) --out results --net $(NET)

# docs/artifact.md: every numbered claim (docs/claims.yaml) recomputed from the committed runs,
# read from the committed benchmark CSVs or checked by its tests; one PASS/FAIL line each.
check-claims: $(STAMP) ## Every claim of docs/artifact.md, PASS or FAIL with the difference [RUNS=dir]
	$(PYTHON) -m accordion_repro.analysis.claims --runs $(RUNS)

# The artifact's functional tier (docs/artifact.md), on 2 cores within 30 minutes: the install,
# the demo, a 2-rank run stopped after epoch 1 and resumed against the same run straight (the
# metrics must agree to the last bit), the tables and figures rebuilt from the committed runs
# (the tables must equal the committed ones), the claims and the fast tests. All of it under
# KICK_DIR, which it starts afresh; nothing committed changes.
KICK_DIR ?= results/kick
KICK_ARGS = model=resnet18 model.width=0.125 dataset=synthetic_cifar10 dataset.train_size=1024 \
	dataset.test_size=256 compressor=powersgd schedule=accordion schedule.interval=1 \
	dist.nproc_per_node=2 trainer.epochs=4 trainer.batch_size=32 optim.warmup_epochs=0 \
	logger.wandb.mode=disabled trainer.progress=never
kick-the-tires: $(STAMP) ## The functional tier: demo, a 2-rank resume, figures, claims, fast tests
	rm -rf $(KICK_DIR)
	$(MAKE) --no-print-directory demo DEMO_DIR=$(KICK_DIR)/demo
	$(PYTHON) -m accordion_repro.train $(KICK_ARGS) hydra.run.dir=$(KICK_DIR)/straight
	$(PYTHON) -m accordion_repro.train $(KICK_ARGS) hydra.run.dir=$(KICK_DIR)/resumed trainer.stop_after_epoch=1
	$(PYTHON) -m accordion_repro.train $(KICK_ARGS) hydra.run.dir=$(KICK_DIR)/resumed
	$(PYTHON) -m accordion_repro.compare_runs $(KICK_DIR)/straight $(KICK_DIR)/resumed
	$(PYTHON) -m accordion_repro.analysis --runs results/runs --out $(KICK_DIR)/rebuilt > /dev/null
	diff -r results/tables $(KICK_DIR)/rebuilt/tables && echo "tables: the committed ones, rebuilt"
	$(PYTHON) -m accordion_repro.analysis.claims --runs results/runs
	$(PYTEST) -m "not slow"

bench: $(STAMP) ## Compressor and DDP step benchmarks
	$(PYTHON) scripts/bench_compressors.py && $(PYTHON) scripts/bench_ddp.py

# Every model's step time (the cost model's compute), then what makes a step cheaper here:
# bf16, channels_last, torch.compile and the device-side input pipeline against fp32 / PIL.
bench-models: $(STAMP) ## Every model's step time, then bf16, channels_last, compile, input pipeline
	$(PYTHON) scripts/bench_models.py && $(PYTHON) scripts/bench_step_options.py

# The CUDA/NCCL path and step times on one GPU (benchmarks/gpu_check.py): one line and exit 0 where
# there is none; results/gpu/<date>-<gpu>/ to commit where there is. Installs nothing (no
# $(STAMP)): it runs with PYTHON=... when given (`make gpu-check PYTHON=python3`, an offline
# node's own torch), else with .venv/ when it exists, else with $(PY). docs/gpu.md.
GPU_PYTHON = $(if $(filter command line,$(origin PYTHON)),$(PYTHON),$(if $(wildcard $(PYTHON)),$(PYTHON),$(PY)))
gpu-check: ## The CUDA/NCCL path and step times on one GPU (docs/gpu.md)
	@$(GPU_PYTHON) -m benchmarks.gpu_check

# The non-torch dependencies as wheels for an offline node (docs/gpu.md): WHEEL_PYTHON=3.12.
WHEEL_PYTHON ?= 3.12
wheelhouse: ## Non-torch dependencies as wheels for an offline node [WHEEL_PYTHON=3.12]
	$(PY) scripts/wheelhouse.py --python-version $(WHEEL_PYTHON)

bench-network: $(STAMP) ## Whole-run training time of the CPU study across a shaped link (root, tc)
	$(PYTHON) scripts/bench_network.py

# A whole DDP step (torch's hooks and ours) across a shaped link, against the link's bound
# (root, iproute2, tc): results/bench/ddp_network.{csv,md}; docs/network_bench.md.
bench-ddp-network: $(STAMP) ## A whole DDP step across a shaped link (root, iproute2, tc)
	$(PYTHON) scripts/bench_ddp_network.py

reproduce-cpu: $(STAMP) ## The CPU-scale study (scripts/reproduce_cpu.py)
	$(PYTHON) scripts/reproduce_cpu.py

# The whole-CIFAR study (scale=cpu_full): resumable, skips finished runs, so it can run in parts.
reproduce-cpu-full: $(STAMP) ## The whole-CIFAR study (scale=cpu_full), resumable
	$(PYTHON) scripts/reproduce_cpu.py --study cpu_full --seeds 42 43 44

# The central-claim study on any CPU (scale=cpu_fp32, fp32 under an AVX2 cap): the queue of issue
# 55, resumable and skip-finished, one run at a time; SIGTERM stops it cleanly (it resumes).
# STUDY_ARGS=--commit commits each finished run directory as it lands.
STUDY_ARGS ?=
study: $(STAMP) ## The fp32 central-claim study's queue (scale=cpu_fp32), resumable [STUDY_ARGS=--commit]
	$(PYTHON) scripts/reproduce_cpu.py --study cpu_fp32 $(STUDY_ARGS)

study-status: $(STAMP) ## Where the fp32 study's queue stands: done / running / queued, wall times, ETA
	$(PYTHON) -m accordion_repro.study_status --study cpu_fp32

# The pilots that sized scale=cpu_fp32 (one real epoch of each arm under the AVX2 cap).
bench-study-pilot: $(STAMP) ## The fp32 study's scale pilots -> results/bench/study_pilots.csv
	$(PYTHON) scripts/bench_study_pilot.py

# The central-claim study in bf16 (scale=cpu_long, 30 epochs; only on a CPU with native bf16): Table 1 ResNet-18 and Figure 2 (b)'s
# data-driven arms for 3 seeds, then Table 3 Top-K. Resumable; skips finished runs.
reproduce-cpu-long: $(STAMP) ## The central-claim study (scale=cpu_long, 30 epochs), resumable
	$(PYTHON) scripts/reproduce_cpu.py --study cpu_long --seeds 42 43 44
