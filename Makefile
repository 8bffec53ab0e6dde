# Thin wrapper over CMake. `make test` is the README's test command.
BUILD      ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
JOBS       ?= $(shell nproc)
FUZZ_SECONDS ?= 60
CTEST_JOBS ?= 2
PREFIX     ?= /usr/local

.PHONY: all deps configure build install test test-asan test-tsan build-clang fuzz bench demo format clean

all: build

deps:
	@scripts/install-deps.sh

# The stamp is the generated Makefile, not CMakeCache.txt: a configure that
# failed (a package missing) leaves a cache but no Makefile, and must rerun.
$(BUILD)/Makefile:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

configure: $(BUILD)/Makefile

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Installs keel.h, libkeel.a, libkeel.so (+ SONAME links), keel.pc and the
# keel binary under $(PREFIX); DESTDIR=/staging prefixes every path.
install: build
	DESTDIR="$(DESTDIR)" cmake --install $(BUILD) --prefix "$(PREFIX)"

test: deps
	$(MAKE) build
	cd $(BUILD) && ctest --output-on-failure -j $(CTEST_JOBS)

# Every target built with clang (warnings are errors there too): the code
# must compile with both gcc 12 and clang 14.
CLANG_BUILD ?= build-clang
build-clang: deps
	cmake -S . -B $(CLANG_BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang
	cmake --build $(CLANG_BUILD) -j $(JOBS)

test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKEEL_SANITIZE=ON
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
		UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 KEEL_ASAN=1 \
		ctest --output-on-failure -j $(CTEST_JOBS)

# ThreadSanitizer over the tests whose threads share an engine or a server:
# the embedding API's threading promises (keel_engine_close during a loop,
# per-thread errors, keel_complete beside a loop) and keel serve's handlers
# (the tests run the TSan-built keel binary). OpenBLAS's own threads are
# not instrumented: one thread there.
TSAN_BUILD ?= build-tsan
TSAN_TESTS ?= test_base test_engine_threads test_engine_api test_server test_server_load test_cachetier
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKEEL_TSAN=ON
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target keel $(TSAN_TESTS)
	cd $(TSAN_BUILD) && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 OPENBLAS_NUM_THREADS=1 \
		ctest --output-on-failure -j $(CTEST_JOBS) -R '^($(shell echo $(TSAN_TESTS) | tr ' ' '|'))$$'

fuzz: deps
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang -DKEEL_FUZZ=ON
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzzers
	@set -e; for f in $(FUZZ_BUILD)/libfuzzer_*; do \
		name=$$(basename $$f); mkdir -p fuzz-corpus/$$name; \
		seeds=""; [ -d fuzz/corpus/$$name ] && seeds=fuzz/corpus/$$name; \
		echo "== $$name ($(FUZZ_SECONDS)s)"; \
		$$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 fuzz-corpus/$$name $$seeds; \
	done

bench: build
	$(BUILD)/keel bench kernels
	$(BUILD)/keel bench attention --quick

demo: deps
	$(MAKE) build
	$(BUILD)/keel demo

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD) $(CLANG_BUILD)
