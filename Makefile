# Two commands: `make run` (compile the example models, serve the page on 127.0.0.1:8000) and
# `make test` (the whole suite). Both create or reuse .venv and install what they need, so a fresh
# clone needs nothing installed by hand.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
SYSTEM_PACKAGES := qemu-user-static libc6-arm64-cross libc6-armhf-cross chromium pocl-opencl-icd ocl-icd-libopencl1 mesa-vulkan-drivers

.PHONY: run test system-deps lint

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,torch,real,opencl,webgpu,cuda,tune,ray]' 'torch==2.13.0'
	touch $(STAMP)

# Debian packages the suite runs generated code with; installed only when missing (CI runs as root).
system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

run: $(STAMP)
	$(PY) -m compiler.cli serve --host 127.0.0.1 --port 8000 --prebuild digits,mobilenet_v2,chars

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Two pytest workers, a test file each at a time (its module fixtures built once): run in one process the suite took
# 31.5 minutes on a 2-core host with its user time about its wall time, most tests leaving the second core idle.
test: $(STAMP) system-deps lint
	$(PY) -m pytest -q -n 2 --dist loadfile
