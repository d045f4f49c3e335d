"""Which optional extra of ``pyproject.toml`` provides which module, and the one line that says so.

A command that meets a module of an extra that is not installed says which extra to install instead of a
``ModuleNotFoundError`` traceback: the command line for every command (:mod:`service.cli`) and the trainer under
``torchrun`` (:mod:`training.train`), which may not import ``service``. Both may import ``kernels``, so the table
lives here; ``tests/test_install.py`` checks it against the extras of ``pyproject.toml``. Imports nothing.
"""

from __future__ import annotations

#: extra -> the top-level modules of its distributions (``ray[default]`` of ``service`` is ``ray``, a core dependency)
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "train": ("torch", "tensorboard"),
    "service": ("fastapi", "uvicorn", "httpx", "sqlalchemy", "alembic", "psycopg", "psutil", "croniter",
                "prometheus_client", "uvloop", "httptools"),
    "hub": ("datasets", "huggingface_hub"),
    "deepspeed": ("deepspeed",),
    "gpu": ("flash_attn",),
}
_EXTRA_OF = {module: extra for extra, modules in EXTRA_MODULES.items() for module in modules}
#: how an extra is installed where ``pip install 'tokenmill[EXTRA]'`` is not enough
_INSTALL = {
    # DeepSpeed's sdist imports torch while it builds: with isolation pip would fetch a multi-GB CUDA torch for it
    "deepspeed": "pip install --no-build-isolation 'tokenmill[deepspeed]' (its build uses the installed torch)",
}


def extra_for(exc: ModuleNotFoundError) -> str | None:
    """The extra whose module ``exc`` could not find, ``None`` for a module no extra provides."""
    return _EXTRA_OF.get((exc.name or "").partition(".")[0])


def install_command(extra: str) -> str:
    """The command that installs ``extra`` into the running environment."""
    return _INSTALL.get(extra, f"pip install 'tokenmill[{extra}]'")


def missing_extra_message(what: str, exc: ModuleNotFoundError) -> str | None:
    """``WHAT needs the 'EXTRA' extra: pip install ...`` for a module of an extra, else ``None`` (a real bug)."""
    extra = extra_for(exc)
    return f"{what} needs the '{extra}' extra: {install_command(extra)}" if extra else None
