"""Developer and CI sessions: ``nox -s tests``, ``nox -s lint``, ``nox -s typecheck``."""

from __future__ import annotations

import nox

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "uv|venv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["lint", "typecheck", "tests"]

PYPROJECT = nox.project.load_toml("pyproject.toml")


@nox.session(python=["3.11"])
def tests(session: nox.Session) -> None:
    """The whole test suite (real sockets, real processes, a real etcd when available)."""
    session.install("-e", ".", *nox.project.dependency_groups(PYPROJECT, "test"))
    session.run("pytest", *session.posargs)


@nox.session(python=["3.11"])
def lint(session: nox.Session) -> None:
    """ruff: lint rules (including flake8-async) and formatting."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=["3.11"])
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the package."""
    session.install("-e", ".", *nox.project.dependency_groups(PYPROJECT, "typecheck"))
    session.run("mypy")
