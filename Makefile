# gradcomp - the two commands of README.md, and a few conveniences.
#   make run    install what is missing, build, run the main job
#   make check  install what is missing (test tools too), build, run every test
BUILD ?= build
JOBS ?= 2
FUZZ_SECONDS ?= 30
FUZZ_RUNS ?= 10000000
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release

.PHONY: all deps build run check test sanitize fuzz fuzz-long valgrind clean

all: build

deps:
	@sh scripts/deps run

build: deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j$(JOBS)

# The main job needs the CLI only: building the tests too would double the wait.
run: deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j$(JOBS) --target gradcomp_cli
	sh scripts/main-job $(BUILD)

test: check
check:
	@sh scripts/deps test
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j$(JOBS)
	cd $(BUILD) && ctest --output-on-failure -j1
	$(MAKE) sanitize
	$(MAKE) fuzz

# The unit, CLI and fuzz-replay tests again under AddressSanitizer + UBSan, at -O1 (as
# AddressSanitizer's authors advise: at -O0 these tests took 2.1x as long, 252 s against
# 119 s; a planted overflow is caught at either level).  Debug keeps the assertions.
sanitize:
	cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" \
	    -DGCOMP_SANITIZE=ON >/dev/null
	cmake --build $(BUILD)-asan -j$(JOBS)
	cd $(BUILD)-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -L 'unit|cli|fuzz'

# Every fuzz target for FUZZ_SECONDS each (libFuzzer + ASan + UBSan, clang).  Fails on any
# failing input (crash-, leak-, timeout-, oom-) in $(BUILD)-fuzz, earlier runs' included:
# move it into tests/fuzz/regress/TARGET/ and fix the bug.  docs/TESTING.md.
fuzz:
	sh tests/fuzz/run_fuzzers.sh $(FUZZ_SECONDS) $(BUILD)-fuzz

# The long run behind docs/TESTING.md's figures: FUZZ_RUNS executions per target, one
# target at a time, niced; figures in $(BUILD)-fuzz/summary.txt.  Hours.
fuzz-long:
	FUZZ_RUNS=$(FUZZ_RUNS) FUZZ_NICE=10 FUZZ_JOBS=1 sh tests/fuzz/run_fuzzers.sh 172800 $(BUILD)-fuzz

# The unit tests under valgrind's memcheck.  valgrind cannot decode AVX-512, which the
# default -march=native build uses on such CPUs (it stops with SIGILL), so this builds
# the portable kernels (GCOMP_NATIVE=OFF) in $(BUILD)-portable.
# Each test runs to the end (ctest's per-test timeouts are too short for memcheck's ~50x).
valgrind:
	cmake -S . -B $(BUILD)-portable -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGCOMP_NATIVE=OFF >/dev/null
	cmake --build $(BUILD)-portable -j$(JOBS)
	@for t in $(BUILD)-portable/tests/unit/test_*; do \
	    echo "valgrind $$t"; \
	    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 valgrind -q --error-exitcode=99 \
	        --leak-check=full --errors-for-leak-kinds=definite $$t >/dev/null || exit 1; \
	done; echo "valgrind: every unit test clean"

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-fuzz $(BUILD)-portable
