# sbx: make deps | build | test | test-sanitize | fuzz | run | format | tidy | thread-safety | clean
BUILD   ?= build
JOBS    ?= $(shell nproc)
SBX_WERROR ?= OFF

# Exactly the Debian 12 packages sbx needs to build, test and run.
DEB_PACKAGES := build-essential cmake ninja-build pkg-config \
  libseccomp-dev libarchive-dev libzstd-dev nlohmann-json3-dev libspdlog-dev libfmt-dev \
  libcli11-dev libsqlite3-dev libssl-dev libboost-dev libboost-system-dev \
  libgtest-dev libgmock-dev libbenchmark-dev libc-ares-dev libnftables-dev libmnl-dev \
  e2fsprogs util-linux iproute2 python3 python3-pip openssl git curl busybox-static clang libclang-rt-14-dev clang-format clang-tidy
# The network tests: nft (rules in test namespaces) and openssl (test CAs).
DEB_PACKAGES += nftables openssl
# Image import and registry tests: Debian's distribution registry and skopeo (OCI layouts from
# docker-archives the tests write, pushes into the registry).
DEB_PACKAGES += docker-registry skopeo
# `sbx template debian` (mmdebstrap); its test's local apt repository (dpkg-deb, dpkg-scanpackages
# of dpkg-dev, apt-ftparchive of apt-utils).
DEB_PACKAGES += mmdebstrap dpkg-dev apt-utils
# make bench's template rows (bench/templates.py): umoci, the unpack peer of `sbx template
# pull` (mmdebstrap, above, makes the Debian root of the image they pull).
DEB_PACKAGES += umoci
# The btrfs tests and bench rows (snapshots that share their data): mkfs.btrfs.
DEB_PACKAGES += btrfs-progs
# The oci runtime's binaries (docs/isolation.md, "The oci runtime (gVisor, runc)"): gVisor's runsc
# and runc. Without them those runtimes are listed unavailable and their tests skipped.
DEB_PACKAGES += runsc runc
# The vm runtime (docs/isolation.md, "The vm runtime"): QEMU's microvm, and Debian's kernel for its
# guests, unpacked into VM_KERNEL_DIR with its modules.dep (never installed as the host's kernel:
# its maintainer scripts are for a host). The generic flavour, not the cloud one: the cloud kernel
# has no 9p, which shares the layers. busybox-static and e2fsprogs make the guest's initramfs and
# writable layer; kmod's depmod writes the modules.dep the runtime reads.
DEB_PACKAGES += qemu-system-x86 busybox-static e2fsprogs kmod
VM_KERNEL_DIR ?= /var/cache/sbx/vm-kernel

.PHONY: all deps build test test-sanitize fuzz run format tidy thread-safety clean bench

all: build

# Idempotent: asks apt only for what dpkg says is missing.
deps:
	@missing=$$(for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "deps: installing:" $$missing; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else echo "deps: all present"; fi
	@if ! ls $(VM_KERNEL_DIR)/boot/vmlinuz-* >/dev/null 2>&1; then \
	  pkg=$$(apt-cache depends linux-image-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$$/\1/p' | head -n1); \
	  if [ -z "$$pkg" ]; then apt-get update -qq; \
	    pkg=$$(apt-cache depends linux-image-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$$/\1/p' | head -n1); fi; \
	  echo "deps: unpacking $$pkg into $(VM_KERNEL_DIR)"; \
	  tmp=$$(mktemp -d) && (cd $$tmp && apt-get download -qq $$pkg) && \
	  rm -rf $(VM_KERNEL_DIR).new && mkdir -p $(VM_KERNEL_DIR).new && \
	  dpkg-deb -x $$tmp/*.deb $(VM_KERNEL_DIR).new && rm -rf $$tmp $(VM_KERNEL_DIR) && \
	  /sbin/depmod -b $(VM_KERNEL_DIR).new $${pkg#linux-image-} && \
	  mv $(VM_KERNEL_DIR).new $(VM_KERNEL_DIR); \
	else echo "deps: vm kernel present in $(VM_KERNEL_DIR)"; fi

$(BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja -DSBX_WERROR=$(SBX_WERROR)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# The thread-safety check first: about 45 s of CPU (20-25 s on 2 idle cores).
test: build thread-safety
	cd $(BUILD) && ctest --output-on-failure -j 2 --timeout 600
	@cat $(BUILD)/battery-report.txt $(BUILD)/tenant-report.txt $(BUILD)/network-report.txt 2>/dev/null || true
	@awk -F': ' 'FNR==1{rt=""} /^runtime: /{rt=$$2; if (!(rt in seen)) {seen[rt]=1; order[++n]=rt}} /^runtime skipped: /{why[rt]=substr($$0, 18)} /^wall time: /{w[rt]=$$2} /^probes run: /{r+=$$2; R[rt]+=$$2} /^passed: /{p+=$$2; P[rt]+=$$2} /^failed: /{f+=$$2; F[rt]+=$$2} /^known failures: /{x+=$$2; X[rt]+=$$2} /^skipped: /{s+=$$2; S[rt]+=$$2} /^host leaks: /{l+=$$2; L[rt]+=$$2} END{if (n) printf "\n"; for (i = 1; i <= n; i++) {k = order[i]; if (k in why) printf "security battery under %s: skipped (%s)\n", k, why[k]; else printf "security battery under %s: probes run %d, passed %d, failed %d, known failures %d, skipped %d, host leaks %d, wall time %s\n", k, R[k], P[k], F[k], X[k], S[k], L[k], w[k]} if (r) printf "\nsecurity battery total: probes run %d, passed %d, failed %d, known failures %d, skipped %d, host leaks %d\n", r, p, f, x, s, l}' $(BUILD)/battery-report.txt $(BUILD)/tenant-report.txt $(BUILD)/network-report.txt 2>/dev/null || true

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
# density, networking (issue 12), templates (issue 13: about 10 more minutes; the first run also
# makes their image with mmdebstrap); writes bench/results/*.json and docs/benchmarks.md.
bench: build
	python3 bench/run.py --build $(BUILD)

format:
	find src tests bench -name '*.cc' -o -name '*.h' -o -name '*.c' | xargs clang-format -i

tidy: $(BUILD)/build.ninja
	find src -name '*.cc' ! -name '*_test.cc' | xargs clang-tidy -p $(BUILD) --quiet

# Clang's thread-safety analysis (src/common/thread_annotations.h) over the directories whose
# classes are annotated; gcc ignores the annotations. clang 14 sees Boost.Asio's coroutine
# support only when told it is there (the two BOOST_ASIO_HAS_* defines). seccomp_default.cc needs
# the build's generated BPF and holds no lock. About 45 s of CPU: part of `make test`.
TS_DIRS  := src/common src/runtime src/storage src/store src/sandbox src/api/http src/api/mcp src/agent src/network
TS_FLAGS := -std=c++20 -fsyntax-only -Wthread-safety -Werror -Isrc \
  -DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL -DSPDLOG_SHARED_LIB -DFMT_SHARED \
  -DBOOST_ASIO_NO_DEPRECATED -DBOOST_ASIO_HAS_CO_AWAIT -DBOOST_ASIO_HAS_STD_COROUTINE
thread-safety:
	find $(TS_DIRS) -name '*.cc' ! -name '*_test.cc' ! -name seccomp_default.cc -print0 | \
	  xargs -0 -n 4 -P $(JOBS) clang++ $(TS_FLAGS)

clean:
	rm -rf $(BUILD)
