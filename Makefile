# Thin targets; the logic lives in packages/*/hatch_build.py, native/ and tests/.
PYTHON ?= python3
DIST ?= dist
PACKAGES := packages/cula packages/cula-cu12 packages/cula-cu13

.PHONY: wheels test gpu-test bench clean

wheels:  ## build the selector and both backend wheels into dist/ (for $(PYTHON))
	$(PYTHON) -m pip wheel --no-deps -w $(DIST) $(PACKAGES)

test: wheels  ## CPU test suite: wheel contents, fresh-venv installs, probe, argument checks
	$(PYTHON) tests/run.py

gpu-test: wheels  ## on a GPU machine: kernels against the float64 reference, both backends
	$(PYTHON) tests/run.py --gpu

clean:
	rm -rf build $(DIST) .venvs
