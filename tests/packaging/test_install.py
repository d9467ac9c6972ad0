"""What a user's install holds: one import package, `mqstore`, and the console script.

The wheel is built from this checkout by setuptools, as `pip install .` would build it,
then unpacked into a fresh target directory, and used from a working directory that has
packages of its own named `engine`, `conf` and `ipc`.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SUBPACKAGES = ("engine", "conf", "ipc", "workers", "pipeline")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
         "--no-build-isolation", "--wheel-dir", str(out), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (built,) = out.glob("mqstore-*.whl")
    return built


@pytest.fixture(scope="module")
def site(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
         "--target", str(target), str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return target


def test_the_wheel_holds_one_top_level_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"mqstore"}
    assert "mqstore/py.typed" in names
    for sub in SUBPACKAGES:
        assert f"mqstore/{sub}/__init__.py" in names
    assert not any(n.startswith("mqstore/bench") or n.startswith("bench/") for n in names)
    (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")] or [None]
    if top_level is not None:
        with zipfile.ZipFile(wheel) as z:
            assert z.read(top_level).decode().split() == ["mqstore"]


def test_an_install_lists_nothing_but_mqstore(site: Path) -> None:
    listed = {p.name for p in site.iterdir()}
    assert {n for n in listed if not n.endswith(".dist-info") and n != "bin"} == {"mqstore"}


def _run_in_foreign_project(site: Path, tmp_path: Path, code: str) -> str:
    """Run `code` from a directory whose own `engine`, `conf` and `ipc` would shadow ours."""
    for name in ("engine", "conf", "ipc"):
        pkg = tmp_path / name
        pkg.mkdir()
        (pkg / "__init__.py").write_text(f"raise ImportError('the user project {name}')\n")
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_import_beside_a_users_own_engine_package(site: Path, tmp_path: Path) -> None:
    out = _run_in_foreign_project(
        site,
        tmp_path,
        "import mqstore, sys\n"
        "from mqstore import StoreClient, SupervisorUnavailable, StoreAccessDenied\n"
        "import mqstore.workers.supervisor, mqstore.workers.cli\n"
        "mqstore.workers.cli.build_parser()\n"
        "print(mqstore.__file__)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('engine', 'conf', 'ipc', 'workers', 'pipeline')))\n",
    )
    where, bare = out.splitlines()
    assert Path(where).is_relative_to(site)
    assert bare == "[]", f"modules imported under a second, bare name: {bare}"


def test_python_dash_m_mqstore_prints_the_version(site: Path, tmp_path: Path) -> None:
    import mqstore

    proc = subprocess.run(
        [sys.executable, "-m", "mqstore", "--version"], cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"mqstore {mqstore.__version__}"
    assert mqstore.__version__ != "0+unknown"


def test_every_documented_exception_is_importable_from_mqstore() -> None:
    import mqstore

    for name in ("SupervisorUnavailable", "StoreAccessDenied", "StoreIOError", "ConfigError",
                 "StoreLockHeld", "RecordError", "StoreDirError"):  # fmt: skip
        exc = getattr(mqstore, name)
        assert isinstance(exc, type) and issubclass(exc, Exception), name
        assert name in mqstore.__all__


def test_no_module_is_run_or_imported_by_its_bare_name() -> None:
    """ruff's banned-api catches `import engine`; this catches the names in strings that
    it cannot see (`python -m workers.cli`, `import_module("engine.x")`, "pkg.mod:main"),
    which would load a second copy of a module from the checkout's top-level folder."""
    bare = "|".join(SUBPACKAGES)
    pattern = re.compile(
        rf"""(-m["',\s]+|import_module\(\s*f?["'])({bare})\.\w"""  # run or imported
        rf"""|["']({bare})(\.\w+)+:\w+["']"""  # an entry point, "pkg.mod:main"
    )
    found = []
    for folder in (*SUBPACKAGES, "mqstore", "bench", "tests"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for no, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line) and path.name != "test_install.py":
                    found.append(f"{path.relative_to(REPO)}:{no}: {line.strip()}")
    assert not found, "\n".join(found)
