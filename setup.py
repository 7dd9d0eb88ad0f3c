"""The optional C module corral._sys (see src/corral/_sys.c): built when a C
compiler and Python's headers are there, skipped otherwise (corral then falls
back to ctypes' C module, about a millisecond slower per run)."""

from setuptools import Extension, setup

# -pthread: the module starts one thread (see netns_ahead in _sys.c)
_SYS = Extension(
    "corral._sys",
    ["src/corral/_sys.c"],
    extra_compile_args=["-pthread"],
    extra_link_args=["-pthread"],
    optional=True,
)

setup(ext_modules=[_SYS])
