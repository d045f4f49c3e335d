"""Only the C extension: the project's metadata is in pyproject.toml.

``optional=True``: where no C compiler or Python headers are found, the install goes on without the extension and
the code takes its pure-Python path (kernels/fasttext_tokens.py)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("kernels._text_native", ["kernels/text_native.c"], optional=True,
                             extra_compile_args=["-O2"])])
