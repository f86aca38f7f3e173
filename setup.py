"""Builds kvsim's optional compiled loops (sim/csrc/*.c, the extension sim._native); everything else is
declared in pyproject.toml.

The extension is optional: where it cannot be built (no compiler), the install goes on without it and
sim/native.py falls back to numpy, with the same results bit for bit. -ffp-contract=off keeps the
compiler from fusing a multiply and an add, which would round once instead of twice (numpy rounds twice).
sim/csrc/core/ holds core.c's parts, which core.c includes (not compiled on their own).
"""

from glob import glob

from setuptools import Extension, setup

setup(ext_modules=[Extension("sim._native", sorted(glob("sim/csrc/*.c")),
                             depends=glob("sim/csrc/*.h") + glob("sim/csrc/core/*"),
                             optional=True, extra_compile_args=["-O2", "-ffp-contract=off"])])
