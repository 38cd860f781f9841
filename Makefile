# Thin targets; the logic lives in tools/release.py, packages/*/hatch_build.py, native/ and tests/.
PYTHON ?= python3
DIST ?= dist
# What `make wheels` builds: backend wheels for these CPythons and architectures (aarch64 is
# cross-compiled). Narrow them for a quick local build, e.g. make wheels PYTHONS=3.11 ARCHS=x86_64.
PYTHONS ?= 3.10 3.11 3.12 3.13
ARCHS ?= x86_64 aarch64

.PHONY: wheels release test gpu-test bench wheelhouse clean

wheels:  ## every release artifact into $(DIST): sdists, selector wheel, manylinux backend wheels
	$(PYTHON) tools/release.py --dist $(DIST) --pythons $(PYTHONS) --archs $(ARCHS)

release: wheels  ## the same as wheels (what a maintainer runs before tagging)

test:  ## CPU test suite on what `make wheels` built: artifacts, fresh-venv install matrix, probe, checks
	$(PYTHON) tests/run.py --dist $(DIST)

gpu-test:  ## on a GPU machine, with the wheels built elsewhere: kernels against the float64 reference
	$(PYTHON) tests/run.py --gpu --dist $(DIST) $(if $(WHEELHOUSE),--wheelhouse $(WHEELHOUSE))

bench:  ## on a GPU machine: cula vs FLA (same inputs, same process) -> benchmarks/results/<gpu>-<backend>.md/.png
	$(PYTHON) tests/run.py --bench --dist $(DIST) $(if $(WHEELHOUSE),--wheelhouse $(WHEELHOUSE)) $(if $(BENCH_ARGS),-- $(BENCH_ARGS))

wheelhouse:  ## what gpu-test / bench take with WHEELHOUSE=DIR on a GPU machine without network (its CPython: GPU_PYTHON)
	$(PYTHON) tests/run.py --fetch-wheelhouse $(or $(WHEELHOUSE),$(error make wheelhouse needs WHEELHOUSE=DIR)) --python-version $(or $(GPU_PYTHON),3.12)

clean:
	rm -rf build $(DIST) .venvs
