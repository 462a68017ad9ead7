"""Compiled parts of the engine (Cython): every ``mooncake_assets/**/*.pyx`` becomes an extension module.

Metadata and dependencies live in pyproject.toml; this file only declares the extensions. ``make install``
builds them in place (``python setup.py build_ext --inplace``); ``pip install`` builds them through the
``[build-system]`` requirements.
"""

from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

ROOT = Path(__file__).parent
extensions = [
    Extension(
        ".".join(p.relative_to(ROOT).with_suffix("").parts),
        [str(p.relative_to(ROOT))],
        include_dirs=[numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O2"],
    )
    for p in sorted((ROOT / "mooncake_assets").rglob("*.pyx"))
]

setup(ext_modules=cythonize(extensions, language_level=3, quiet=True))
