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
ALL_CFLAGS = $(CSTD) $(WARN) $(CFLAGS) -fopenmp -Isrc -I$(BUILD)/gen -I$(BLAS_INC) -MMD -MP $(EXTRA_CFLAGS)
LDLIBS    = -L$(BLAS_LIB) -Wl,-rpath,$(BLAS_LIB) -lopenblas -lyaml -ljansson \
            -lgrpc -lgpr -lprotobuf-c -lzstd -lz -lsnappy -lpcre2-8 -lutf8proc -lm -lpthread -fopenmp
LDFLAGS  ?=

BUILD    ?= build
SRCS      = $(shell find src -name '*.c' ! -path 'src/main.c' | sort)
OBJS      = $(SRCS:%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/gen/federated.pb-c.o
TEST_SRCS = $(sort $(wildcard tests/unit/test_*.c))
TESTS     = $(TEST_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
BENCH_SRCS = $(sort $(wildcard bench/*.c))
BENCHES   = $(BENCH_SRCS:bench/%.c=$(BUILD)/bench/%)

.PHONY: all build deps test test-asan bench demo clean fuzz venv
all: build
build: $(BUILD)/spes $(TESTS) $(BENCHES)

deps:
	@bash scripts/install-deps.sh

# Generated protobuf-c code for the wire contract.
$(BUILD)/gen/federated.pb-c.c $(BUILD)/gen/federated.pb-c.h: proto/federated.proto
	@mkdir -p $(BUILD)/gen
	protoc-c --proto_path=proto --c_out=$(BUILD)/gen proto/federated.proto

$(BUILD)/obj/gen/federated.pb-c.o: $(BUILD)/gen/federated.pb-c.c
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(CFLAGS) -I$(BUILD)/gen -c $< -o $@

$(BUILD)/obj/%.o: %.c | $(BUILD)/gen/federated.pb-c.h
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/libspes.a: $(OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/spes: $(BUILD)/obj/src/main.o $(BUILD)/libspes.a
	$(CC) $(LDFLAGS) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libspes.a
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

# The whole suite under AddressSanitizer + UndefinedBehaviorSanitizer, in its own build dir.
test-asan: deps
	@$(MAKE) --no-print-directory build BUILD=build-asan OPT=-O1 \
	  EXTRA_CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
	  LDFLAGS="-fsanitize=address,undefined"
	@SPES_ASAN=1 ASAN_OPTIONS=detect_leaks=1 bash tests/run_all.sh build-asan

bench: deps
	@$(MAKE) --no-print-directory build
	@bash tests/setup_venv.sh
	@bash bench/run_all.sh $(BUILD)

demo: deps
	@$(MAKE) --no-print-directory build
	@$(BUILD)/spes demo

# libFuzzer harnesses (tests/fuzz/fuzz_*.c), each run for FUZZ_SECONDS from its committed
# seed corpus (tests/fuzz/corpus/<name>/). New findings land in build-fuzz/findings/.
FUZZ_SECONDS ?= 30
FUZZ_SRCS = $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_SAN  = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
fuzz: deps
	@$(MAKE) --no-print-directory build-fuzz/libspes.a BUILD=build-fuzz CC=clang OPT=-O1 WERROR= \
	  EXTRA_CFLAGS="-fsanitize=fuzzer-no-link $(FUZZ_SAN)"
	@mkdir -p build-fuzz/bin build-fuzz/findings
	@for src in $(FUZZ_SRCS); do \
	  name=$$(basename $$src .c); \
	  clang $(CSTD) -O1 -g -fopenmp -Isrc -Ibuild-fuzz/gen -I$(BLAS_INC) -fsanitize=fuzzer $(FUZZ_SAN) \
	    -o build-fuzz/bin/$$name $$src build-fuzz/libspes.a $(LDLIBS) || exit 1; \
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
