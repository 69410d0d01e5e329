/*
 * fuzz_selftest.c - a target that must crash: it aborts on any input starting with "CRASH".
 * Not fuzzed for real; test_runner.sh hands it to run_fuzzers.sh with that input among its
 * seeds (regress/selftest/) to prove the runner fails when a fuzzer finds something.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size >= 5 && !memcmp(data, "CRASH", 5)) abort();
    return 0;
}
