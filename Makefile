# sbx: make deps | build | test | test-sanitize | fuzz | run | format | tidy | clean
BUILD   ?= build
JOBS    ?= $(shell nproc)
SBX_WERROR ?= OFF

# Exactly the Debian 12 packages sbx needs to build, test and run.
DEB_PACKAGES := build-essential cmake ninja-build pkg-config \
  libseccomp-dev libarchive-dev libzstd-dev nlohmann-json3-dev libspdlog-dev libfmt-dev \
  libcli11-dev libsqlite3-dev libssl-dev libboost-dev libboost-system-dev \
  libgtest-dev libgmock-dev libbenchmark-dev \
  e2fsprogs util-linux iproute2 python3 busybox-static clang-format clang-tidy clang libclang-rt-14-dev

.PHONY: all deps build test test-sanitize fuzz run format tidy clean bench

all: build

# Idempotent: asks apt only for what dpkg says is missing.
deps:
	@missing=$$(for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "deps: installing:" $$missing; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else echo "deps: all present"; fi

$(BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja -DSBX_WERROR=$(SBX_WERROR)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j 2 --timeout 600
	@cat $(BUILD)/battery-report.txt $(BUILD)/tenant-report.txt 2>/dev/null || true
	@awk -F': ' '/^probes run: /{r+=$$2} /^passed: /{p+=$$2} /^failed: /{f+=$$2} /^skipped: /{s+=$$2} /^host leaks: /{l+=$$2} END{if (r) printf "\nsecurity battery total: probes run %d, passed %d, failed %d, skipped %d, host leaks %d\n", r, p, f, s, l}' $(BUILD)/battery-report.txt $(BUILD)/tenant-report.txt 2>/dev/null || true

# The API, agent channel, manager and store unit tests (CTest label `sanitize`, see
# SBX_SANITIZE_TESTS in CMakeLists.txt) built once more with -fsanitize=address,undefined in
# their own tree and run with every report fatal and leak checking on. Not part of `make test`.
SANITIZE_BUILD ?= build-sanitize
SANITIZE_ENV := ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:strict_string_checks=1 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$(CURDIR)/tests/sanitize/ubsan.supp \
  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitize/lsan.supp
$(SANITIZE_BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(SANITIZE_BUILD) -G Ninja -DSBX_SANITIZE=ON -DSBX_WERROR=$(SBX_WERROR)

test-sanitize: deps $(SANITIZE_BUILD)/build.ninja
	cmake --build $(SANITIZE_BUILD) -j $(JOBS) --target sbx_sanitize_tests
	cd $(SANITIZE_BUILD) && $(SANITIZE_ENV) ctest -L sanitize --output-on-failure -j 2 --timeout 600

# libFuzzer targets (fuzz/), built with clang in their own tree, each run for FUZZ_SECONDS.
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
$(FUZZ_BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(FUZZ_BUILD) -G Ninja -DSBX_FUZZ=ON -DCMAKE_C_COMPILER=clang-14 \
	  -DCMAKE_CXX_COMPILER=clang++-14

fuzz: deps $(FUZZ_BUILD)/build.ninja
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target sbx_fuzz_targets
	FUZZ_SECONDS=$(FUZZ_SECONDS) fuzz/run.sh $(FUZZ_BUILD)

# Starts the daemon on 127.0.0.1:7777 with the embedded defaults (SQLite under /var/lib/sbx, the
# native runtime, the host template, no network). Ctrl-C stops it; sandboxes keep running.
run: build
	$(BUILD)/sbx serve

# Benchmarks (issue 5), not part of `make test`: sbx against bwrap, runc, crun and fork+exec,
# density; writes bench/results/*.json and docs/benchmarks.md. Under 20 minutes on 2 cores.
bench: build
	python3 bench/run.py --build $(BUILD)

format:
	find src tests bench -name '*.cc' -o -name '*.h' -o -name '*.c' | xargs clang-format -i

tidy: $(BUILD)/build.ninja
	find src -name '*.cc' ! -name '*_test.cc' | xargs clang-tidy -p $(BUILD) --quiet

clean:
	rm -rf $(BUILD)
