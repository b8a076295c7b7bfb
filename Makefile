# SPES-C build. `make` builds build/spes; `make test` installs deps, builds, runs every test.
# Sources are discovered: every src/**/*.c goes into build/libspes.a, every tests/unit/test_*.c
# becomes its own test program linked against it.

CC       ?= gcc
ARCH     ?= -march=native
OPT      ?= -O3
CSTD      = -std=c17 -D_GNU_SOURCE
WERROR   ?= -Werror
WARN      = -Wall -Wextra $(WERROR) -Wno-unused-parameter
BLAS_INC  = /usr/include/x86_64-linux-gnu/openblas-openmp
BLAS_LIB  = /usr/lib/x86_64-linux-gnu/openblas-openmp
CFLAGS   ?= $(OPT) -g $(ARCH)
# Ranks inside a node (src/parallel/): OpenMPI from Debian (libopenmpi-dev), found through pkg-config.
MPI_CFLAGS := $(shell pkg-config --cflags ompi-c 2>/dev/null || echo -I/usr/lib/x86_64-linux-gnu/openmpi/include)
MPI_LIBS   := $(shell pkg-config --libs ompi-c 2>/dev/null || echo -lmpi)
ALL_CFLAGS = $(CSTD) $(WARN) $(CFLAGS) -fopenmp -Isrc -I$(BUILD)/gen -I$(BLAS_INC) $(MPI_CFLAGS) -MMD -MP $(CUDA_CFLAGS) $(EXTRA_CFLAGS)
CPU_LDLIBS = -L$(BLAS_LIB) -Wl,-rpath,$(BLAS_LIB) -lopenblas -lyaml -ljansson \
            -lgrpc -lgpr -lprotobuf-c -lmicrohttpd -lisal -lzstd -lz -lsnappy -lpcre2-8 -lutf8proc $(MPI_LIBS) -lm -lpthread -fopenmp
LDLIBS    = $(CPU_LDLIBS) $(CUDA_LDLIBS)
LDFLAGS  ?=

BUILD    ?= build
SRCS      = $(shell find src -name '*.c' ! -path 'src/main.c' | sort)
# Every proto/*.proto becomes generated protobuf-c code in $(BUILD)/gen.
PROTOS    = $(sort $(wildcard proto/*.proto))
PROTO_HDRS = $(PROTOS:proto/%.proto=$(BUILD)/gen/%.pb-c.h)
OBJS      = $(SRCS:%.c=$(BUILD)/obj/%.o) $(PROTOS:proto/%.proto=$(BUILD)/obj/gen/%.pb-c.o)

# ---- CUDA backend (optional) ---------------------------------------------------------------
# Built when nvcc is found (PATH, else /usr/local/cuda/bin); `make CUDA=0` forces a CPU-only
# build. The binary then has both backends and picks one at run time (`device: auto` falls
# back to cpu when no GPU or driver is visible), so a CUDA build runs everywhere the CUDA
# libraries (cudart, cuBLAS, cuBLASLt) are installed, GPU or not.
NVCC       ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
CUDA       ?= $(if $(NVCC),1,0)
CUDA_ARCHS ?= 80 89 90
ifeq ($(CUDA),1)
ifeq ($(NVCC),)
$(error CUDA=1 but nvcc was not found (PATH, /usr/local/cuda/bin); set NVCC=/path/to/nvcc or build with CUDA=0)
endif
CUDA_HOME  ?= $(patsubst %/bin/,%,$(dir $(realpath $(NVCC))))
CUDA_LIB   ?= $(CUDA_HOME)/lib64
CUDA_TOP   := $(shell echo $(CUDA_ARCHS) | tr ' ' '\n' | sort -n | tail -1)
# SASS for every arch, plus PTX of the highest (JIT-compiled by newer GPUs' drivers).
CUDA_GENCODE = $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
               -gencode arch=compute_$(CUDA_TOP),code=compute_$(CUDA_TOP)
CUDA_ARCH_NAMES := $(shell echo $(CUDA_ARCHS) | tr ' ' '\n' | sort -n | sed 's/^/sm_/' | paste -sd, -)
# No fast-math: the backend is tested against the cpu kernels and must be reproducible.
# -lineinfo: compute-sanitizer and profilers point at source lines (no runtime cost).
NVCCFLAGS  ?= -O3 -lineinfo
ALL_NVCCFLAGS = -std=c++17 $(NVCCFLAGS) $(CUDA_GENCODE) -Isrc -I$(BUILD)/gen -MMD -MP \
               -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter,-fPIC -Werror all-warnings \
               -DSPES_WITH_CUDA -DSPES_CUDA_ARCHS='"$(CUDA_ARCH_NAMES)"' -DSPES_CUDA_LIB='"$(CUDA_LIB)"'
CU_SRCS    = $(sort $(wildcard src/ops/cuda/*.cu))
OBJS      += $(CU_SRCS:%.cu=$(BUILD)/obj/%.o)
# src/parallel/nccl.c includes cuda_runtime.h and nccl.h (both in the CUDA toolkit here).
CUDA_CFLAGS = -DSPES_WITH_CUDA -I$(CUDA_HOME)/include
# cudart statically (it finds the driver with dlopen); cuBLAS/cuBLASLt are dlopen'ed when a
# CUDA backend opens (src/ops/cuda/cublas_loader.cu), found through this rpath: a CUDA build
# starts as fast as a CPU one and runs, falling back to cpu, where no CUDA is installed.
# NCCL (device collectives of src/parallel/) is linked directly: libnccl.so sits next to cudart.
CUDA_LDLIBS = -L$(CUDA_LIB) -Wl,-rpath,$(CUDA_LIB) -lnccl -lcudart_static -ldl -lrt -lpthread -lstdc++
endif
# Objects whose meaning depends on the CUDA choice are rebuilt when it changes (switching
# CUDA=0/1 or CUDA_ARCHS in one build dir): $(BUILD)/cuda.config holds the current choice.
CUDA_CONFIG := CUDA=$(CUDA) ARCHS=$(CUDA_ARCHS) NVCC=$(NVCC)
ifneq ($(filter-out clean,$(or $(MAKECMDGOALS),all)),)
$(shell mkdir -p $(BUILD) && { echo '$(CUDA_CONFIG)' | cmp -s - $(BUILD)/cuda.config || echo '$(CUDA_CONFIG)' > $(BUILD)/cuda.config; })
endif
CUDA_DEPENDENT = $(patsubst %.c,$(BUILD)/obj/%.o,$(shell grep -l SPES_WITH_CUDA $(SRCS) src/main.c))
TEST_SRCS = $(sort $(wildcard tests/unit/test_*.c))
TESTS     = $(TEST_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
# The unit test programs this build defines, one name a line: tests/run_all.sh runs these and no
# other file in $(BUILD)/tests (one left there by a moved or deleted test is stale). Rewritten
# only when the list changes.
TEST_LIST = $(BUILD)/tests.list
BENCH_SRCS = $(sort $(wildcard bench/*.c))
BENCHES   = $(BENCH_SRCS:bench/%.c=$(BUILD)/bench/%)
# GPU tests (tests/gpu/test_*.c): built with the CUDA backend, run only by `make test-gpu`.
GPU_TEST_SRCS = $(sort $(wildcard tests/gpu/test_*.c))
GPU_TESTS = $(if $(filter 1,$(CUDA)),$(GPU_TEST_SRCS:tests/gpu/%.c=$(BUILD)/tests-gpu/%) $(BUILD)/tests-gpu/gpu_count)

.PHONY: all build deps test test-asan test-gpu bench bench-dist-memory bench-gpu bench-quality demo clean fuzz venv FORCE
all: build
build: $(BUILD)/spes $(TESTS) $(TEST_LIST) $(BENCHES) $(GPU_TESTS)

$(TEST_LIST): FORCE
	@mkdir -p $(dir $@)
	@printf '%s\n' $(notdir $(TESTS)) | cmp -s - $@ || printf '%s\n' $(notdir $(TESTS)) > $@

deps:
	@bash scripts/install-deps.sh

# Generated protobuf-c code: the wire contract (federated.proto), TensorBoard event records
# (tfevents.proto). A pattern rule with two targets makes both in one protoc-c run.
$(BUILD)/gen/%.pb-c.c $(BUILD)/gen/%.pb-c.h: proto/%.proto
	@mkdir -p $(BUILD)/gen
	protoc-c --proto_path=proto --c_out=$(BUILD)/gen $<
# Kept after the build (make would delete them as intermediates of the pattern rules).
.SECONDARY: $(PROTO_HDRS) $(PROTO_HDRS:%.h=%.c)

$(BUILD)/obj/gen/%.pb-c.o: $(BUILD)/gen/%.pb-c.c
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(CFLAGS) -I$(BUILD)/gen -c $< -o $@

$(BUILD)/obj/%.o: %.c | $(PROTO_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(ALL_NVCCFLAGS) -c $< -o $@

$(CUDA_DEPENDENT) $(CU_SRCS:%.cu=$(BUILD)/obj/%.o): $(BUILD)/cuda.config

$(BUILD)/libspes.a: $(OBJS) $(BUILD)/cuda.config
	@rm -f $@
	ar rcs $@ $(OBJS)

$(BUILD)/spes: $(BUILD)/obj/src/main.o $(BUILD)/libspes.a
	$(CC) $(LDFLAGS) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libspes.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests -o $@ $< $(BUILD)/libspes.a $(LDLIBS) -lcmocka

$(BUILD)/tests-gpu/%: tests/gpu/%.c $(BUILD)/libspes.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests -o $@ $< $(BUILD)/libspes.a $(LDLIBS) -lcmocka

$(BUILD)/bench/%: bench/%.c $(BUILD)/libspes.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(BUILD)/libspes.a $(LDLIBS)

# Test-only Python references (torch, transformers, tokenizers, pyarrow) in a git-ignored venv.
venv:
	@bash tests/setup_venv.sh

test: deps
	@$(MAKE) --no-print-directory build
	@bash tests/setup_venv.sh
	@bash tests/run_all.sh $(BUILD)

# The GPU tests (tests/gpu/, each CUDA op against its cpu kernel), then the same programs
# under compute-sanitizer memcheck when it exists and a GPU is visible. Without a GPU every
# test reports itself skipped. Needs a CUDA build (nvcc).
ifeq ($(CUDA),1)
test-gpu: $(GPU_TESTS)
	@bash tests/run_gpu.sh $(BUILD)
else
test-gpu:
	@echo "test-gpu: this is a CPU-only build (CUDA=0 or no nvcc): no GPU tests to run"
endif

# The whole suite under AddressSanitizer + UndefinedBehaviorSanitizer, in its own build dir
# (CPU-only: the sanitizers do not see into the GPU, and it keeps CI time down).
test-asan: deps
	@$(MAKE) --no-print-directory build BUILD=build-asan OPT=-O1 CUDA=0 \
	  EXTRA_CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
	  LDFLAGS="-fsanitize=address,undefined"
	@SPES_ASAN=1 ASAN_OPTIONS=detect_leaks=1 bash tests/run_all.sh build-asan

bench: deps
	@$(MAKE) --no-print-directory build
	@bash tests/setup_venv.sh
	@bash bench/run_all.sh $(BUILD)

# Data parallelism's per-rank memory against ZeRO's theory for 1, 2, 4 ranks and the tokens/s of
# the gradient reduction overlapped or not (bench/dist_memory.sh, docs/distributed.md): 30 runs,
# ~8 min on an idle 2-core machine, so a target of its own rather than a `make bench` section.
bench-dist-memory: deps
	@$(MAKE) --no-print-directory build
	@BENCH_ONLY=dist_memory bash bench/run_all.sh $(BUILD)

# Training quality (bench/quality/run.sh, docs/quality.md): SPES vs centralised vs fedavg at an
# equal token budget, 3 seeds, two corpora, plus ablations; ~20 min on an idle 2-core machine.
bench-quality: deps
	@$(MAKE) --no-print-directory build
	@bash bench/quality/run.sh $(BUILD)

# GPU benchmarks (bench/run_gpu.sh) on a CUDA build.
bench-gpu: deps
ifeq ($(CUDA),1)
	@$(MAKE) --no-print-directory build
	@bash tests/setup_venv.sh
	@bash bench/run_gpu.sh $(BUILD)
else
	@echo "bench-gpu: this is a CPU-only build (CUDA=0 or no nvcc): skipped"
endif

demo: deps
	@$(MAKE) --no-print-directory build
	@$(BUILD)/spes demo

# libFuzzer harnesses (tests/fuzz/fuzz_*.c), each run for FUZZ_SECONDS from its committed
# seed corpus (tests/fuzz/corpus/<name>/). New findings land in build-fuzz/findings/.
FUZZ_SECONDS ?= 30
FUZZ_SRCS = $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_SAN  = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
fuzz: deps
	@$(MAKE) --no-print-directory build-fuzz/libspes.a BUILD=build-fuzz CC=clang OPT=-O1 WERROR= CUDA=0 \
	  EXTRA_CFLAGS="-fsanitize=fuzzer-no-link $(FUZZ_SAN)"
	@mkdir -p build-fuzz/bin build-fuzz/findings
	@for src in $(FUZZ_SRCS); do \
	  name=$$(basename $$src .c); \
	  clang $(CSTD) -O1 -g -fopenmp -Isrc -Ibuild-fuzz/gen -I$(BLAS_INC) -fsanitize=fuzzer $(FUZZ_SAN) \
	    -o build-fuzz/bin/$$name $$src build-fuzz/libspes.a $(CPU_LDLIBS) || exit 1; \
	  mkdir -p tests/fuzz/corpus/$$name build-fuzz/corpus/$$name; \
	  echo "fuzz: $$name for $(FUZZ_SECONDS)s"; \
	  build-fuzz/bin/$$name -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=4096 \
	    -artifact_prefix=build-fuzz/findings/$$name- build-fuzz/corpus/$$name tests/fuzz/corpus/$$name \
	    2>build-fuzz/$$name.log || { tail -40 build-fuzz/$$name.log; exit 1; }; \
	  grep -E "^#[0-9]+.*DONE" build-fuzz/$$name.log | tail -1; \
	done

clean:
	rm -rf build build-asan build-fuzz

-include $(shell find $(BUILD) build-asan -name '*.d' 2>/dev/null)
