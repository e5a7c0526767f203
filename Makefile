# ember: build, run, test and benchmark.
#
#   make run    ARGS="..."   install what is missing, build, run the agent (root)
#   make check               fmt, module graph and code shape, clippy, unit tests and the tests that need
#                            no root (no apt, no BPF; 26 s on 2 CPUs with target/ built, up to 14 min
#                            when ember's crates recompile)
#   make e2e                 the end-to-end test binary (tests/tests/e2e), with what its suites need (root for BPF)
#   make test                all of it: check's steps, the Helm/deploy checks, then every test of the workspace
#   make bench               criterion benches, then the overhead harness (root)
#   make docs                regenerate docs/configuration.md and docs/metrics.md (checked by make check)
#   make deps | test-deps | build | clean   (deps: what build and run need; test-deps: the rest)
#
# Everything is built once, with the release profile, and with frame pointers so
# that ember can profile itself: every cargo call below sees the same RUSTFLAGS,
# and every build is `--all-targets` so that dependencies are compiled with one
# feature set (a plain `cargo build` leaves out dev-dependencies, whose features
# would make `cargo test` and `cargo bench` compile a dozen crates again; the
# bench profile inherits release and shares its artifacts). `cargo clippy` only
# checks, so it has its own (metadata-only) pass.

SHELL := /bin/bash
.DEFAULT_GOAL := build

CARGO ?= cargo
CARGO_BUILD = $(CARGO) build --release --workspace --all-targets
GO ?= go
PYTHON ?= python3

# Appended once (a sub-make inherits it already set, and a different RUSTFLAGS
# string would make cargo rebuild everything).
ifeq ($(findstring force-frame-pointers,$(RUSTFLAGS)),)
RUSTFLAGS += -C force-frame-pointers=yes
endif
export RUSTFLAGS

TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
EMBER := $(TARGET_DIR)/release/ember
PPROFCHECK := $(TARGET_DIR)/pprofcheck
# A real OTLP/gRPC receiver for the OTLP metrics test: the official protos and grpcio.
OTLP_VENV := $(TARGET_DIR)/otlp-venv
OTLP_PIP_PINS := grpcio==1.85.1 opentelemetry-proto==1.45.2 jsonschema==4.26.0
# speedscope's own JSON schema of its file format (from its npm package), which `ember record
# --format speedscope` is checked against.
SPEEDSCOPE_VERSION := 1.25.0
SPEEDSCOPE_SCHEMA := $(TARGET_DIR)/speedscope-$(SPEEDSCOPE_VERSION)/file-format-schema.json
# py-spy, the reference the Python frame tests compare ember with (its wheel carries the binary).
PYSPY_VENV := $(TARGET_DIR)/pyspy-venv
PYSPY_PIP_PINS := py-spy==0.4.3
# Debian sid's python3.14 with sid's libc6 and what else it needs, unpacked into a root the
# Python tests chroot into (bookworm's glibc is too old for it); see tests/python314/build-root.sh.
PYTHON314_DIR := $(TARGET_DIR)/python314
# CPython 3.11 built against musl with a shared libpython (as Alpine's), for the Python tests'
# musl run; see tests/python-musl/build.sh.
PYTHON_MUSL_DIR := $(TARGET_DIR)/python-musl
# Free-threaded CPython 3.13t and 3.14t built from source (no archive here ships one), for the
# Python tests' free-threaded runs; see tests/python-ft/build.sh.
PYTHON_FT_DIR := $(TARGET_DIR)/python-ft
# Debian's cloud kernels the kernel matrix test boots (tests/kernels/fetch-kernels.sh); outside
# the tree, so that they outlive `make clean` and are shared by every checkout.
EMBER_KERNEL_CACHE ?= /var/cache/ember-kernels

# Debian/Ubuntu packages, in two sets.
# RUN_PKGS: what building and running ember need (`make run`, `make build`): clang for the BPF
# programs, libelf and zlib for libbpf, pkg-config, and the C toolchain (gcc, make) that
# libbpf-sys and Rust's linker use. deploy/Dockerfile builds with the first four; its
# rust:1-bookworm base already has gcc and make.
RUN_PKGS := clang libelf-dev zlib1g-dev pkg-config make gcc libc6-dev
# TEST_PKGS: what only the tests use (`make test`, `make e2e`, `make bench`): llvm's binutils
# for fixtures, the Go pprof tools the tests validate profiles with, perf and bpftool.
TEST_PKGS := llvm golang-go golang-github-google-pprof-dev linux-perf bpftool
# The JIT tests profile Node and a JVM (javac compiles their Java fixture at test time).
TEST_PKGS += nodejs openjdk-17-jdk-headless
# The OTLP metrics test's receiver runs in a Python venv (otlp-venv below).
TEST_PKGS += python3-venv
# The stack tests profile Debian's own python3 and the stripped xz against perf dwarf.
TEST_PKGS += python3 xz-utils
# The DWARF test builds its inlining fixture with g++ and compares with binutils' addr2line.
TEST_PKGS += g++ binutils
# The explorer's browser test drives Debian's chromium through chromedriver with Debian's
# selenium (tests/browser/explorer.py, run by /usr/bin/python3); curl fetches profiles.
TEST_PKGS += chromium chromium-driver python3-selenium curl
# The chart's renderer (tests/deploy/helmrender, built in GOPATH mode by deploy-check and the
# cluster test): Helm's template functions, YAML libraries and the JSON Schema validator helm 3
# checks values.schema.json with; python3-yaml for tests/deploy/chart_docs.py (`make docs`).
TEST_PKGS += golang-github-masterminds-sprig-dev golang-github-ghodss-yaml-dev golang-gopkg-yaml.v3-dev \
	golang-github-xeipuuv-gojsonschema-dev python3-yaml
# `ember top`'s test runs it in tmux and reads the screen (capture-pane).
TEST_PKGS += tmux
# The kernel matrix boots Debian's kernels under qemu on a busybox initramfs (tests/kernels/):
# installed by `make kernels` (part of `make test`), not by `make run`.
KERNEL_PKGS := qemu-system-x86 busybox-static cpio
# Only `make bench` needs these.
BENCH_PKGS := python3 bpftrace
# Daemons the resource-metrics tests start themselves on free loopback ports
# (Prometheus scrapes ember, node_exporter is the cross-check; promtool comes with
# prometheus). Installed with a policy-rc.d that forbids starting services, so
# the packages leave nothing listening on :9090/:9100, with or without systemd.
# debuginfod: the symbols tests serve debug files from a directory with it.
DAEMON_PKGS := prometheus prometheus-node-exporter debuginfod
# The one-node cluster test (tests/k8s/start-node.sh): containerd, runc, CNI plugins, and
# buildah for the images; kube-proxy and the kubelet need iptables, conntrack, ethtool, socat.
DAEMON_PKGS += containerd runc containernetworking-plugins buildah iptables conntrack ethtool socat

# Ubuntu ships perf and bpftool in linux-tools-* instead.
OS_ID := $(shell . /etc/os-release 2>/dev/null && echo $$ID)
ifeq ($(OS_ID),ubuntu)
TEST_PKGS := $(filter-out linux-perf bpftool,$(TEST_PKGS)) linux-tools-common linux-tools-$(shell uname -r)
endif

# $(call ensure_pkgs,PACKAGES): a no-op when all are installed; as root, one
# `apt-get update` and one install of the missing ones; otherwise say what to
# install and fail.
define ensure_pkgs
	@set -e; \
	if ! command -v dpkg >/dev/null 2>&1; then \
		echo "make deps: no dpkg here (not Debian/Ubuntu). Install the equivalents of: $(1)" >&2; \
		exit 1; \
	fi; \
	missing=""; \
	for p in $(1); do \
		dpkg -s "$$p" 2>/dev/null | grep -q '^Status: install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ]; then \
		echo "Missing packages:$$missing" >&2; \
		echo "Install them (as root) with:" >&2; \
		echo "  apt-get update && apt-get install -y --no-install-recommends$$missing" >&2; \
		exit 1; \
	fi; \
	echo "make deps: installing$$missing"; \
	apt-get update; \
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends $$missing
endef

# $(call ensure_daemon_pkgs,PACKAGES): ensure_pkgs for packages that ship a service,
# which the install must not start (invoke-rc.d and deb-systemd-invoke both obey
# /usr/sbin/policy-rc.d exit 101). An existing policy-rc.d is left alone.
define ensure_daemon_pkgs
	@set -e; \
	missing=""; \
	for p in $(1); do \
		dpkg -s "$$p" 2>/dev/null | grep -q '^Status: install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ]; then \
		echo "Missing packages:$$missing" >&2; \
		echo "Install them (as root) with:" >&2; \
		echo "  apt-get update && apt-get install -y --no-install-recommends$$missing" >&2; \
		exit 1; \
	fi; \
	policy=/usr/sbin/policy-rc.d; \
	if [ ! -e $$policy ]; then \
		trap 'rm -f '$$policy EXIT; \
		printf '#!/bin/sh\n# ember make deps: do not start services while installing\nexit 101\n' >$$policy; \
		chmod 755 $$policy; \
	fi; \
	echo "make deps: installing$$missing (services not started)"; \
	apt-get update; \
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends $$missing
endef

.PHONY: deps test-deps bench-deps rust-deps build run check docs check-only e2e e2e-deps e2e-only test bench clean \
	speedscope-schema \
	fmt-check modgraph clippy pprofcheck test-only bench-only k8s-apiserver k8s-node k8s-images deploy-check \
	otlp-venv pyspy-venv python314-root python-musl python-ft fuzz kernels

# What building and running need (make run, make build).
deps: rust-deps
	$(call ensure_pkgs,$(RUN_PKGS))

# What the tests need besides (make test, make e2e, make bench).
test-deps: deps
	$(call ensure_pkgs,$(TEST_PKGS))
	$(call ensure_daemon_pkgs,$(DAEMON_PKGS))

bench-deps: test-deps
	$(call ensure_pkgs,$(BENCH_PKGS))

# Rust comes from rustup (Debian's cargo is older than ember's rust-version).
rust-deps:
	@if ! command -v $(CARGO) >/dev/null 2>&1; then \
		echo "cargo not found: install Rust >= 1.85 with rustup (https://rustup.rs)," >&2; \
		echo "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c rustfmt,clippy" >&2; \
		exit 1; \
	fi; \
	if ! $(CARGO) fmt --version >/dev/null 2>&1 || ! $(CARGO) clippy --version >/dev/null 2>&1; then \
		if command -v rustup >/dev/null 2>&1; then \
			rustup component add rustfmt clippy; \
		else \
			echo "cargo fmt / cargo clippy missing: install the rustfmt and clippy components" >&2; \
			exit 1; \
		fi; \
	fi

build: deps
	$(CARGO_BUILD)

run: build
	exec $(EMBER) run $(ARGS)

# The Go checker, against Debian's golang-github-google-pprof-dev (no network).
pprofcheck: $(PPROFCHECK)
$(PPROFCHECK): tests/pprofcheck/main.go
	GO111MODULE=off GOFLAGS= GOPATH=$(TARGET_DIR)/gopath:/usr/share/gocode \
		GOCACHE=$(TARGET_DIR)/gocache $(GO) build -o $@ ./tests/pprofcheck

fmt-check:
	$(CARGO) fmt --all -- --check

# The module graphs of agent/src and parse/src: no import circles, no import against the data flow;
# and the shape of production code: no file over 800 lines, no function over 120, no Result<_, String>.
modgraph:
	$(PYTHON) tests/modgraph.py --self-test
	$(PYTHON) tests/modgraph.py
	$(PYTHON) tests/sizes.py --self-test && $(PYTHON) tests/sizes.py
	$(PYTHON) tests/bpfunits.py --self-test && $(PYTHON) tests/bpfunits.py

clippy:
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings

# The generated reference pages; unit tests (config::reference, metrics::reference) fail when
# the checked-in pages differ from what this writes.
docs: rust-deps
	$(CARGO_BUILD)
	$(EMBER) docs --out docs
	python3 tests/deploy/chart_docs.py --write

speedscope-schema: $(SPEEDSCOPE_SCHEMA)
$(SPEEDSCOPE_SCHEMA):
	mkdir -p $(dir $@)
	$(PYTHON) -c "import io, sys, tarfile, urllib.request; \
		t = tarfile.open(fileobj=io.BytesIO(urllib.request.urlopen(sys.argv[1], timeout=60).read())); \
		sys.stdout.buffer.write(t.extractfile('package/dist/release/file-format-schema.json').read())" \
		https://registry.npmjs.org/speedscope/-/speedscope-$(SPEEDSCOPE_VERSION).tgz > $@.tmp
	mv $@.tmp $@

# Made once; remove the directory to re-install.
otlp-venv: $(OTLP_VENV)/.installed
$(OTLP_VENV)/.installed:
	$(PYTHON) -m venv $(OTLP_VENV)
	$(OTLP_VENV)/bin/pip install -q --disable-pip-version-check $(OTLP_PIP_PINS)
	touch $@

pyspy-venv: $(PYSPY_VENV)/.installed
$(PYSPY_VENV)/.installed:
	$(PYTHON) -m venv $(PYSPY_VENV)
	$(PYSPY_VENV)/bin/pip install -q --disable-pip-version-check $(PYSPY_PIP_PINS)
	touch $@

# Made once (root, network to deb.debian.org); remove the directory to rebuild it.
python314-root: $(PYTHON314_DIR)/root/.complete
$(PYTHON314_DIR)/root/.complete: tests/python314/build-root.sh
	@if [ "$$(id -u)" = 0 ]; then tests/python314/build-root.sh $(PYTHON314_DIR); \
	else echo "skipping the python3.14 root (needs root: apt-get, dpkg-deb, chroot)"; fi

# Made once (root: apt-get for musl-tools and the sources); remove the directory to rebuild it.
python-musl: $(PYTHON_MUSL_DIR)/.complete
$(PYTHON_MUSL_DIR)/.complete: tests/python-musl/build.sh
	@if [ "$$(id -u)" = 0 ]; then tests/python-musl/build.sh $(PYTHON_MUSL_DIR); \
	else echo "skipping the musl CPython build (needs root: apt-get)"; fi

# Made once per minor (network to deb.debian.org); remove a directory to rebuild it.
python-ft: $(PYTHON_FT_DIR)313/.complete $(PYTHON_FT_DIR)314/.complete
$(PYTHON_FT_DIR)%/.complete: tests/python-ft/build.sh
	tests/python-ft/build.sh $(PYTHON_FT_DIR)$* $(shell echo $* | sed 's/^3/3./')

# What the end-to-end suites read: the agent, the checkers and the interpreters built above.
E2E_ENV = EMBER_BIN=$(EMBER) EMBER_PPROFCHECK=$(PPROFCHECK) EMBER_OTLP_PYTHON=$(OTLP_VENV)/bin/python \
	EMBER_PYSPY=$(PYSPY_VENV)/bin/py-spy EMBER_PYTHON314_ROOT=$(PYTHON314_DIR)/root \
	EMBER_PYTHON_MUSL=$(PYTHON_MUSL_DIR) EMBER_PYTHON_FT=$(PYTHON_FT_DIR) \
	EMBER_KERNEL_CACHE=$(EMBER_KERNEL_CACHE) EMBER_SPEEDSCOPE_SCHEMA=$(SPEEDSCOPE_SCHEMA)

# The end-to-end tests that need no root, no BPF and nothing `make e2e-deps` builds, by name in
# the one binary (`suite::test`; a filter per entry): run by `make check`.
E2E_UNPRIVILEGED := cli:: kernels::parses_markers_through_console_noise \
	dwarf::a_big_binarys_chains_under_the_caps_match_addr2line

# --no-fail-fast: every suite runs and every failure is reported, not just the first.
test-only:
	$(E2E_ENV) $(CARGO) test --release --workspace --no-fail-fast

# The unit tests of every crate, then the unprivileged end-to-end tests. `--workspace` on every
# call: `-p ember-tests` would resolve other features and build ember a second time.
check-only:
	EMBER_BIN=$(EMBER) $(CARGO) test --release --workspace --lib --no-fail-fast
	EMBER_BIN=$(EMBER) $(CARGO) test --release --workspace --test e2e --no-fail-fast -- \
		$(E2E_UNPRIVILEGED)

# The fast tier: no root, no packages, no network (rustup's cargo, clippy and rustfmt, python3).
check: rust-deps
	$(MAKE) --no-print-directory fmt-check
	$(MAKE) --no-print-directory modgraph
	$(MAKE) --no-print-directory clippy
	$(CARGO_BUILD)
	$(MAKE) --no-print-directory check-only

# The end-to-end binary alone (`make e2e-only ARGS=record::` runs one suite).
e2e-only:
	$(E2E_ENV) $(CARGO) test --release --workspace --test e2e --no-fail-fast -- $(ARGS)

# Everything the suites use that is built, not installed: the Go checker, the cluster, the
# venvs, the interpreters and the kernel matrix's kernels.
e2e-deps:
	$(MAKE) --no-print-directory pprofcheck
	$(MAKE) --no-print-directory k8s-apiserver
	$(MAKE) --no-print-directory k8s-node
	$(MAKE) --no-print-directory otlp-venv
	$(MAKE) --no-print-directory speedscope-schema
	$(MAKE) --no-print-directory pyspy-venv
	$(MAKE) --no-print-directory python314-root
	$(MAKE) --no-print-directory python-musl
	$(MAKE) --no-print-directory python-ft
	$(MAKE) --no-print-directory kernels

e2e: test-deps
	$(CARGO_BUILD)
	$(MAKE) --no-print-directory e2e-deps
	$(MAKE) --no-print-directory e2e-only

# The kernel matrix's kernels: each suite's cloud kernel, fetched once (root, network to
# deb.debian.org); remove a suite's directory under EMBER_KERNEL_CACHE to fetch it again.
kernels:
	$(call ensure_pkgs,$(KERNEL_PKGS))
	@if [ "$$(id -u)" = 0 ]; then tests/kernels/fetch-kernels.sh $(EMBER_KERNEL_CACHE); \
	else echo "skipping the kernel matrix's kernels (needs root: apt-get into its own state)"; fi

# A real kube-apiserver (built once from Debian's source, cached outside the tree) for the
# pod watcher's end-to-end test; needs root for apt, like the BPF tests.
k8s-apiserver:
	@if [ "$$(id -u)" = 0 ]; then tests/k8s/build-apiserver.sh; \
	else echo "skipping the kube-apiserver build (needs root)"; fi

# The rest of a one-node cluster from the same source (kubelet, controller-manager, scheduler,
# kube-proxy, kubectl, pause), and the images it runs, made with buildah from the release
# binary (tests/k8s/README.md). Built once, cached outside the tree with the apiserver.
k8s-node:
	@if [ "$$(id -u)" = 0 ]; then tests/k8s/build-apiserver.sh node; \
	else echo "skipping the one-node cluster build (needs root)"; fi
k8s-images: k8s-node
	@test -x $(EMBER) || { echo "$(EMBER) missing: make build" >&2; exit 1; }
	tests/k8s/build-images.sh $(TARGET_DIR)/k8s-images $(EMBER)

# Manifests, Helm chart and Dockerfile: linters, schemas, policy, and the agent on their config.
deploy-check:
	EMBER_BIN=$(EMBER) tests/deploy/check.sh

test: test-deps
	$(MAKE) --no-print-directory fmt-check
	$(MAKE) --no-print-directory modgraph
	$(MAKE) --no-print-directory clippy
	$(CARGO_BUILD)
	$(MAKE) --no-print-directory e2e-deps
	$(MAKE) --no-print-directory deploy-check
	$(MAKE) --no-print-directory test-only

# cargo-fuzz targets of the parsers of container input in parse/ (perf map, jitdump, unwind
# tables, perf task records, object reader, DWARF reader, symbol tables, symbol names, demangling, mountinfo,
# CPython line tables, strings, debug offsets and code objects, musl's tsd offset),
# FUZZ_SECONDS each; not part of `make test`. libFuzzer needs nightly flags: RUSTC_BOOTSTRAP lets stable Rust take them.
FUZZ_SECONDS ?= 60
fuzz: rust-deps
	@command -v cargo-fuzz >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked
	cd fuzz && for t in perfmap jitdump unwind perf_records object_reader dwarf symbol_table symbol_names demangle mountinfo \
		python_lines python_strings python_debug_offsets python_code libc_tsd; do \
		RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run -O $$t -- -max_total_time=$(FUZZ_SECONDS) \
			-print_final_stats=1 || exit 1; \
	done

bench-only:
	EMBER_BIN=$(EMBER) $(CARGO) bench -p ember -p ember-parse
	EMBER_BIN=$(EMBER) $(PYTHON) bench/overhead.py
	EMBER_BIN=$(EMBER) $(PYTHON) bench/overhead.py --unwind-compare --seconds 20
	EMBER_BIN=$(EMBER) $(PYTHON) bench/overhead.py --bpftrace-compare
	$(CARGO) build -p ember
	EMBER_BIN=$(EMBER) $(PYTHON) bench/overhead.py --dwarf-compare --debug-exe $(TARGET_DIR)/debug/ember
	EMBER_BIN=$(EMBER) $(PYTHON) bench/stacks.py
	EMBER_BIN=$(EMBER) $(PYTHON) bench/offcpu.py --write --runs 3
	EMBER_BIN=$(EMBER) $(PYTHON) bench/python.py
	EMBER_BIN=$(EMBER) $(PYTHON) bench/python.py --service
	EMBER_BIN=$(EMBER) $(PYTHON) bench/churn.py --write

bench: bench-deps
	$(CARGO_BUILD)
	$(MAKE) --no-print-directory bench-only

clean:
	$(CARGO) clean
	rm -rf $(PPROFCHECK) $(TARGET_DIR)/gopath $(TARGET_DIR)/gocache $(TARGET_DIR)/bench
