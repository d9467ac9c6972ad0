# Two entry points that work on a fresh machine (Python 3.11, Java 17, pip):
#   make run   - set up .venv, then run the main job
#   make test  - set up .venv, then run the whole test suite (slow, Spark and load included)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

NATIVE_SRC := mqstore/_native.c $(wildcard ipc/native/*.c ipc/native/*.h engine/native/*.c engine/native/*.h)
NATIVE_SO  := mqstore/.native-built
# conf, engine, ipc, workers, pipeline: linked under mqstore/, where compileall does not follow
PY_PKGS    := mqstore conf engine ipc workers pipeline
PY_SRC     := $(wildcard mqstore/*.py conf/*.py engine/*.py ipc/*.py workers/*.py workers/*/*.py pipeline/*.py)
BYTECODE   := mqstore/.bytecode-built
# format("mqstore")'s JVM provider (pipeline/jvm): compiled against the installed
# pyspark's jars, picked up by pipeline.session.
JVM_SRC      := $(wildcard pipeline/jvm/src/mqstore/spark/*.java)
JVM_SERVICES := pipeline/jvm/resources/META-INF/services/org.apache.spark.sql.sources.DataSourceRegister
PROVIDER_JAR := pipeline/jvm/mqstore-spark.jar
ASAN_LIB   = $(shell $(CC) -print-file-name=libasan.so)

.PHONY: setup run test lint bench reliability clean sanitize

setup: $(STAMP) $(NATIVE_SO) $(PROVIDER_JAR) $(BYTECODE)

# The editable install builds the C extension mqstore._native (setup.py: gcc and the
# Python headers); later edits of ipc/native/ and engine/native/ rebuild it in place.
$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,spark]'
	$(MAKE) --no-print-directory plain-path
	touch $(STAMP)

# setuptools' editable install puts an import hook in its .pth: a finder module importing
# pathlib, urllib.parse, fnmatch and importlib.util, ~7 ms of CPU in every interpreter of
# the venv, paid by each of the 16-64 producers the sync checks start at once
# (bench/results/client_start.md). Its .pth becomes a plain path entry naming $(VENV)/path,
# which holds only a link to mqstore/: as with the hook, nothing of the checkout but
# mqstore is importable (a path to the checkout itself would expose engine, conf, bench).
.PHONY: plain-path
plain-path:
	mkdir -p $(VENV)/path
	ln -sfn $(CURDIR)/mqstore $(VENV)/path/mqstore
	site=$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))'); \
	for pth in "$$site"/__editable__.mqstore-*.pth; do \
	    test -f "$$pth" || { echo "no editable .pth of mqstore in $$site" >&2; exit 1; }; \
	    echo '$(CURDIR)/$(VENV)/path' > "$$pth"; done

# Bytecode of the package, written once here: with PYTHONDONTWRITEBYTECODE set (as on the
# shared machine) no process writes it, and every producer process compiled the modules it
# imports from source again: 0.36-0.39 s of CPU per `from mqstore import StoreClient`
# against 0.07-0.09 s with it, which 16-64 producers starting at once paid in the perf
# checks' own run (bench/results/sync_disk.md). compileall writes it whatever that says.
$(BYTECODE): $(STAMP) $(PY_SRC)
	$(PY) -m compileall -q -j 0 $(PY_PKGS)
	touch $(BYTECODE)

$(NATIVE_SO): $(STAMP) $(NATIVE_SRC)
	$(PY) setup.py --quiet build_ext --inplace
	touch $(NATIVE_SO)

# javac and jar come with the JDK Spark 4 runs on (Java 17 or 21).
$(PROVIDER_JAR): $(STAMP) $(JVM_SRC) $(JVM_SERVICES)
	rm -rf build/jvm
	mkdir -p build/jvm/classes/META-INF/services
	javac --release 17 -Xlint:all,-path,-processing -Werror -d build/jvm/classes \
		-cp "$$($(PY) -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')/jars/*" \
		$(JVM_SRC)
	cp $(JVM_SERVICES) build/jvm/classes/META-INF/services/
	jar --create --file $@.tmp -C build/jvm/classes .
	mv $@.tmp $@

run: $(STAMP) $(NATIVE_SO) $(PROVIDER_JAR) $(BYTECODE)
	$(PY) -m mqstore.workers.demo_run

# The load suite runs even when the rest failed (one run tells every failure), and the
# target still fails when either did.
test: $(STAMP) $(NATIVE_SO) $(PROVIDER_JAR) $(BYTECODE)
	failed=0; \
	$(PY) -m pytest tests --ignore=tests/load || failed=1; \
	if [ -d tests/load ]; then $(PY) -m pytest -n 4 tests/load || failed=1; fi; \
	exit $$failed

lint: $(STAMP) $(NATIVE_SO)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) -m bench

# The reliability suites at full size (tests/RELIABILITY.md): 200 crash cycles, 50+
# power-loss cycles, 10 cases per corruption kind; figures in reliability.json.
reliability: $(STAMP)
	MQSTORE_RELIABILITY_FULL=1 MQSTORE_RELIABILITY_REPORT=reliability.json \
		$(PY) -m pytest tests/reliability -m reliability -n 2

# The native tests against an AddressSanitizer + UndefinedBehaviorSanitizer build of the
# extension (built aside in build/sanitize, loaded by tests/native/conftest.py); a Python
# host needs libasan preloaded. Leaks are not checked: the interpreter keeps its own.
# PYTHONMALLOC=malloc: every Python object its own malloc block, so a C read past the end
# of a bytes or str argument is caught; under pymalloc's pools (objects up to 512 bytes,
# most test inputs) it reads the pool's next block unseen (tests/RELIABILITY.md, "native
# code under the sanitizers": a 2-byte born address read as 4 was seen only so).
sanitize: $(STAMP)
	rm -rf build/sanitize
	MQSTORE_SANITIZE=1 $(PY) setup.py --quiet build_ext \
		--build-lib build/sanitize/lib --build-temp build/sanitize/tmp --force
	MQSTORE_NATIVE_SO=$$(ls build/sanitize/lib/mqstore/_native*.so) PYTHONMALLOC=malloc \
		LD_PRELOAD=$(ASAN_LIB) ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
		UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		$(PY) -m pytest tests/native -p no:cacheprovider

clean:
	rm -rf $(VENV) data build *.egg-info mqstore/*.so $(NATIVE_SO) $(PROVIDER_JAR) $(BYTECODE)
