# duet: `make run` installs what is missing, builds, and runs the demo; `make test` builds and
# runs the whole test suite (plus the file-parsing tests under AddressSanitizer, the CPU kernels
# on aarch64 under qemu, and a short run of every fuzz target); `make fuzz` fuzzes for longer.

BUILD_DIR  ?= build
ASAN_DIR   ?= build-asan
ARM_DIR    ?= build-arm
FUZZ_DIR   ?= build-fuzz
FUZZ_SECONDS ?= 300
JOBS       ?= $(shell nproc)
DEMO_MODEL ?= models/demo-deepseek-coder-1.3b-q4_0.gguf
PORT       ?= 8000

.PHONY: all deps build test test-fast test-asan test-arm test-fuzz fuzz fuzz-build run demo-model bench clean

all: build

deps:
	@./scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release > /dev/null
	@cmake --build $(BUILD_DIR) -j$(JOBS)

test: test-fast test-asan test-arm test-fuzz

test-fast: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j$(JOBS)

# Tests labelled `asan` (those that parse untrusted input) again under AddressSanitizer. Built
# without the CUDA backend: none of its code runs there, and so the build without CUDA is
# configured, compiled and tested by every `make test`.
test-asan: deps
	@cmake -S . -B $(ASAN_DIR) -DCMAKE_BUILD_TYPE=Debug -DDUET_SANITIZE=address -DDUET_CUDA=OFF > /dev/null
	@cmake --build $(ASAN_DIR) -j$(JOBS) --target duet_asan_tests
	cd $(ASAN_DIR) && ctest -L asan --output-on-failure -j$(JOBS)

# The CPU kernels cross-compiled for aarch64 (NEON with dotprod) and run under qemu.
test-arm: deps
	@cmake -S tests/arm -B $(ARM_DIR) -DCMAKE_TOOLCHAIN_FILE=$(CURDIR)/cmake/aarch64-linux-gnu.cmake > /dev/null
	@cmake --build $(ARM_DIR) -j$(JOBS)
	cd $(ARM_DIR) && ctest --output-on-failure -j$(JOBS)

# libFuzzer targets (clang, ASan and UBSan) over the readers of untrusted input: test-fuzz runs
# each for a few seconds over its seed corpus (tests/fuzz/corpus); fuzz runs each for
# FUZZ_SECONDS, keeping what it finds in $(FUZZ_DIR)/tests/fuzz/work.
fuzz-build: deps
	@CC=clang CXX=clang++ cmake -S . -B $(FUZZ_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDUET_FUZZ=ON \
	  -DDUET_BUILD_TESTS=OFF > /dev/null
	@cmake --build $(FUZZ_DIR) -j$(JOBS) --target duet_fuzzers

test-fuzz: fuzz-build
	cd $(FUZZ_DIR) && ctest -L fuzz --output-on-failure -j$(JOBS)

fuzz: fuzz-build
	@for t in $$(ls tests/fuzz/corpus); do \
	  tests/fuzz/run_fuzzer.sh $(FUZZ_DIR)/tests/fuzz/fuzz_$$t tests/fuzz/corpus/$$t $(FUZZ_SECONDS)s \
	    $(FUZZ_DIR)/tests/fuzz/work/$$t || exit 1; \
	done

demo-model: build
	@mkdir -p $(dir $(DEMO_MODEL))
	@[ -f $(DEMO_MODEL) ] || $(BUILD_DIR)/duet make-model --preset deepseek-coder-1.3b --type q4_0 --seed 1 -o $(DEMO_MODEL)

run: demo-model
	@echo "Serving $(DEMO_MODEL) on http://127.0.0.1:$(PORT) (Ctrl-C stops). Try:"
	@echo "  curl http://127.0.0.1:$(PORT)/v1/chat/completions -H 'Content-Type: application/json' \\"
	@echo "    -d '{\"model\": \"demo\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}], \"max_tokens\": 32}'"
	$(BUILD_DIR)/duet serve --model $(DEMO_MODEL) --served-model-name demo --host 127.0.0.1 --port $(PORT)

clean:
	rm -rf $(BUILD_DIR) $(ASAN_DIR) $(ARM_DIR) $(FUZZ_DIR)
