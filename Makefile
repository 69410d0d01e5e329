# gradcomp - the two commands of README.md, and a few conveniences.
#   make run    install what is missing, build, run the main job
#   make check  install what is missing (test tools too), build, run every test
BUILD ?= build
JOBS ?= 2
FUZZ_SECONDS ?= 30
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release

.PHONY: all deps build run check test sanitize fuzz clean

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

# The unit, CLI and fuzz-replay tests again under AddressSanitizer + UBSan.
sanitize:
	cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DGCOMP_SANITIZE=ON >/dev/null
	cmake --build $(BUILD)-asan -j$(JOBS)
	cd $(BUILD)-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -L 'unit|cli|fuzz'

fuzz:
	sh tests/fuzz/run_fuzzers.sh $(FUZZ_SECONDS) $(BUILD)-fuzz

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-fuzz
