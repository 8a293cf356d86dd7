# forge: make builds build/libforge.a, build/libforge.so, build/forge (CLI) and build/forge_tests;
# `make test` runs the test suite (the same GoogleTest binary CTest runs) and the Python and Go packages' tests.
CC ?= cc
CXX ?= c++
BUILD ?= build
GLSLANG ?= glslangValidator
PREFIX ?= /usr/local
OPT ?= -O2 -g
# The first python3 that has pytest: a python3 ahead of Debian's on PATH (pyenv, a venv) may
# lack the python3-pytest that tools/install-deps.sh installs for /usr/bin/python3.
ifeq ($(origin PYTHON),undefined)
PYTHON := $(firstword $(shell for p in python3 /usr/bin/python3; do "$$p" -c 'import pytest' 2>/dev/null && echo "$$p"; done) python3)
endif
# Go 1.23 from bookworm-backports (tools/install-deps.sh) where it is, else the `go` on PATH
GO ?= $(firstword $(wildcard /usr/lib/go-1.23/bin/go) go)

WARN := -Wall -Wextra -Wno-format-truncation -Wno-unused-function
CFLAGS_FORGE := -std=c11 $(OPT) $(WARN) -fPIC -fvisibility=hidden -I. -I$(BUILD)
LIBS := -lcjson -lpcre2-8 -lutf8proc -lpthread -ldl -lm

# The version lives in forge.h (FORGE_VERSION_MAJOR/MINOR/PATCH); the library's name, soname and forge.pc follow it.
version_part = $(shell awk '$$2 == "FORGE_VERSION_$(1)" { print $$3 }' forge.h)
VERSION_MAJOR := $(call version_part,MAJOR)
VERSION := $(VERSION_MAJOR).$(call version_part,MINOR).$(call version_part,PATCH)

KERNELS := $(wildcard kernels/*.comp kernels/*.glsl) kernels/kernels.list tools/build_kernels.sh

.PHONY: all lib cli tests test test-python test-go install clean fuzz examples sanitize dist check-dist
all: lib cli tests examples
lib: $(BUILD)/libforge.a $(BUILD)/libforge.so
cli: $(BUILD)/forge
tests: $(BUILD)/forge_tests

$(BUILD)/forge_kernels.h: $(KERNELS)
	@mkdir -p $(BUILD)
	sh tools/build_kernels.sh $(GLSLANG) kernels $@

$(BUILD)/forge.o: forge.c $(wildcard src/*.c) forge.h $(BUILD)/forge_kernels.h
	$(CC) $(CFLAGS_FORGE) -c forge.c -o $@

# The drop-in single file for embedders: dist/forge.c (forge.c's sections with the SPIR-V
# embedded: compiling it needs no glslang) and dist/forge.h. DIST_LINES=1 adds #line directives.
dist: dist/forge.c dist/forge.h
dist/forge.c: forge.c $(wildcard src/*.c) forge.h $(BUILD)/forge_kernels.h tools/amalgamate.sh
	@mkdir -p dist
	sh tools/amalgamate.sh $(BUILD)/forge_kernels.h $@ $(if $(DIST_LINES),--line)
dist/forge.h: forge.h
	@mkdir -p dist
	cp forge.h $@
# dist/forge.c compiled and run as an embedder would, with glslang out of reach (CI runs it).
check-dist: dist
	sh tools/check_dist.sh

$(BUILD)/libforge.a: $(BUILD)/forge.o
	ar rcs $@ $^

$(BUILD)/libforge.so: $(BUILD)/forge.o
	$(CC) -shared -Wl,-soname,libforge.so.$(VERSION_MAJOR) -o $@ $^ $(LIBS)

CLI_SRCS := tools/forge_cli.c tools/cli_common.c tools/cli_train.c tools/cli_batch.c tools/cli_bench.c tools/cli_embed.c
$(BUILD)/forge: $(CLI_SRCS) tools/cli.h forge.h $(BUILD)/libforge.a
	$(CC) -std=c11 $(OPT) $(WARN) -I. -DFORGE_SOURCE_DIR='"$(CURDIR)"' $(CLI_SRCS) $(BUILD)/libforge.a $(LIBS) -o $@

# The examples (the README's library example in C, and C++), built as a user would (forge.h and
# the static library); the tests run them. tools/check_install.sh builds them against an install.
examples: $(BUILD)/example_generate $(BUILD)/example_chat
$(BUILD)/example_generate: examples/generate.c forge.h $(BUILD)/libforge.a
	$(CC) -std=c11 $(OPT) $(WARN) -I. examples/generate.c $(BUILD)/libforge.a $(LIBS) -o $@
$(BUILD)/example_chat: examples/chat.cpp forge.h $(BUILD)/libforge.a
	$(CXX) -std=c++17 $(OPT) $(WARN) -I. examples/chat.cpp $(BUILD)/libforge.a $(LIBS) -o $@

# Tests reach internals: tests/internal.c includes forge.c with FORGE_TESTING.
TEST_SRCS := $(wildcard tests/test_*.cpp)
$(BUILD)/internal_test.o: tests/internal.c tests/internal.h forge.c $(wildcard src/*.c) forge.h $(BUILD)/forge_kernels.h
	$(CC) -std=c11 $(OPT) $(WARN) -DFORGE_TESTING -I. -I$(BUILD) -c tests/internal.c -o $@

$(BUILD)/forge_tests: $(TEST_SRCS) $(wildcard tests/*.h) $(BUILD)/internal_test.o
	$(CXX) -std=c++17 $(OPT) -Wall -I. -Itests -DFORGE_SOURCE_DIR='"$(CURDIR)"' $(TEST_SRCS) $(BUILD)/internal_test.o \
		-lgtest -lgtest_main $(LIBS) -o $@

test: $(BUILD)/forge_tests $(BUILD)/forge $(BUILD)/example_generate $(BUILD)/example_chat test-python test-go
	cd $(BUILD) && ./forge_tests

# The Python package (bindings/python) against this build's library; the story it generates is
# compared with the CLI's.
test-python: $(BUILD)/libforge.so $(BUILD)/forge
	FORGE_LIBRARY=$(BUILD)/libforge.so FORGE_CLI=$(BUILD)/forge $(PYTHON) -m pytest -q bindings/python/tests

# The Go package (bindings/go, cgo over the static library) with go vet and go test; the story
# it generates is compared with the CLI's. The package links build/libforge.a (its #cgo flags
# name that path), so with another BUILD this target says so and does nothing. Go's caches and
# the tests' temporary files go under the build tree, and no toolchain or module is downloaded
# (the package uses the standard library only).
GO_ENV := GOCACHE=$(CURDIR)/$(BUILD)/go-cache GOPATH=$(CURDIR)/$(BUILD)/go-path GOTMPDIR=$(CURDIR)/$(BUILD)/go-tmp \
	TMPDIR=$(CURDIR)/$(BUILD)/go-tmp GOTOOLCHAIN=local GOFLAGS=-mod=readonly GOPROXY=off
test-go: $(BUILD)/libforge.a $(BUILD)/forge
ifeq ($(BUILD),build)
	mkdir -p $(BUILD)/go-tmp
	cd bindings/go && $(GO_ENV) $(GO) vet ./... && $(GO_ENV) FORGE_CLI=$(CURDIR)/$(BUILD)/forge $(GO) test -count=1 ./...
else
	@echo "test-go: skipped: the Go package links build/libforge.a, not $(BUILD)/libforge.a"
endif

# The suite under ASan + UBSan + LSan, built in build-san/: any report fails the run (CI runs it).
# Leaks inside system libraries (Mesa, the Vulkan loader) are suppressed in tests/lsan.supp.
SAN_OPT := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
sanitize:
	$(MAKE) BUILD=build-san OPT="$(SAN_OPT)" build-san/forge_tests build-san/forge build-san/example_generate build-san/example_chat
	cd build-san && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=0 \
		LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp:print_suppressions=0 \
		UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ./forge_tests

# The Python package goes where Debian's python3 looks for a prefix's packages
# (/usr/local/lib/python3.X/dist-packages); set PYTHON_SITE to put it elsewhere.
PYTHON_SITE = $(PREFIX)/lib/python$(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')/dist-packages
install: lib cli
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 forge.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(BUILD)/libforge.a $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(BUILD)/libforge.so $(DESTDIR)$(PREFIX)/lib/libforge.so.$(VERSION)
	ln -sf libforge.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libforge.so.$(VERSION_MAJOR)
	ln -sf libforge.so.$(VERSION_MAJOR) $(DESTDIR)$(PREFIX)/lib/libforge.so
	install -m 755 $(BUILD)/forge $(DESTDIR)$(PREFIX)/bin/
	install -d $(DESTDIR)$(PREFIX)/share/forge
	install -m 644 models/stories260K/stories260K.gguf $(DESTDIR)$(PREFIX)/share/forge/
	sed -e 's|@PC_TO_PREFIX@|../..|' -e 's|@PC_LIBDIR@|lib|' -e 's|@PC_INCLUDEDIR@|include|' -e 's|@VERSION@|$(VERSION)|' \
		tools/forge.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/forge.pc
	install -d $(DESTDIR)$(PYTHON_SITE)/forge
	install -m 644 bindings/python/forge/__init__.py bindings/python/forge/_ffi.py bindings/python/forge/py.typed \
		$(DESTDIR)$(PYTHON_SITE)/forge/

clean:
	rm -rf $(BUILD)

# Fuzz targets (clang, libFuzzer + ASan/UBSan). `make fuzz` first replays each target's committed
# corpus (tests/fuzz/corpus/TARGET: minimized, every input run once, any crash fails), then
# fuzzes it for FUZZ_SECONDS from a copy of that corpus in the build tree. tests/fuzz/README.md
# records the long runs.
FUZZ_SECONDS ?= 30
FUZZERS := safetensors gguf config tokenizer_json tokenize adapter state discover chat train_data grammar schema tool_reply sentence
FUZZ_CC ?= clang
fuzz: $(FUZZERS:%=$(BUILD)/fuzz_%)
	@for f in $(FUZZERS); do \
		echo "replaying tests/fuzz/corpus/$$f ($$(ls tests/fuzz/corpus/$$f | wc -l) inputs)"; \
		$(BUILD)/fuzz_$$f tests/fuzz/corpus/$$f/* > $(BUILD)/fuzz_$$f.replay.log 2>&1 || { tail -n 40 $(BUILD)/fuzz_$$f.replay.log; exit 1; }; \
		rm -rf $(BUILD)/corpus_$$f; mkdir -p $(BUILD)/corpus_$$f; cp tests/fuzz/corpus/$$f/* $(BUILD)/corpus_$$f/; \
		case $$f in tokenize|chat|grammar|schema|tool_reply) len=8192 ;; *) len=65536 ;; esac; \
		echo "fuzzing $$f for $(FUZZ_SECONDS) s"; \
		$(BUILD)/fuzz_$$f -max_total_time=$(FUZZ_SECONDS) -max_len=$$len -artifact_prefix=$(BUILD)/ $(BUILD)/corpus_$$f \
			> $(BUILD)/fuzz_$$f.log 2>&1 || { tail -n 40 $(BUILD)/fuzz_$$f.log; exit 1; }; tail -n 1 $(BUILD)/fuzz_$$f.log; \
	done

# `forge train`'s data reader lives in the CLI: its target includes tools/cli_train.c and links cli_common.c.
$(BUILD)/fuzz_train_data: tests/fuzz/fuzz_train_data.c tests/fuzz/fuzz_common.h tools/cli_train.c tools/cli_common.c tools/cli.h \
		tests/internal.c tests/internal.h forge.c $(wildcard src/*.c) forge.h $(BUILD)/forge_kernels.h
	$(FUZZ_CC) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -DFORGE_TESTING \
		-DFORGE_SOURCE_DIR='"$(CURDIR)"' -I. -I$(BUILD) -Itests tests/fuzz/fuzz_train_data.c tests/internal.c tools/cli_common.c $(LIBS) -o $@

$(BUILD)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.h tests/internal.c tests/internal.h forge.c $(wildcard src/*.c) forge.h $(BUILD)/forge_kernels.h
	$(FUZZ_CC) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -DFORGE_TESTING \
		-DFORGE_SOURCE_DIR='"$(CURDIR)"' -I. -I$(BUILD) -Itests tests/fuzz/fuzz_$*.c tests/internal.c $(LIBS) -o $@
