"""The optional C module corral._sys (see src/corral/_sys.c): built when a C
compiler and Python's headers are there, skipped otherwise (corral then falls
back to ctypes' C module, about a millisecond slower per run)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("corral._sys", ["src/corral/_sys.c"], optional=True)])
