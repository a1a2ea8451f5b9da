"""Every ```python block of README.md and docs/*.md runs.

Each block is written to a file in a fresh temporary directory and run there by a new
Python process with a timeout, so a sample can use relative paths ("bus"), start
processes and leave files behind without touching anything else.

An HTML comment on the line before a block changes how it runs:

``<!-- pytest -->``
    the block is a test module: it runs under ``python -m pytest``, with the fsbus
    pytest plugin loaded as it is for any user;
``<!-- spark -->``
    the block needs Spark: it gets a variable ``spark`` (a local SparkSession set up
    for this machine) and runs under the ``spark`` and ``slow`` markers;
``<!-- two-mounts: /mnt/a /mnt/b -->``
    the block needs two mounts of one directory at those paths: it runs as root in a
    private mount namespace where both are bind mounts of one fresh directory (the
    host's mounts are not touched);
``<!-- no-run: reason -->``
    the block is not run (say why; prefer a runnable sample).

Blocks fenced with another language (```text, ```bash, ```pycon) are not run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 90.0
SPARK_TIMEOUT = 300.0

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<info>[^\s`]*)")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>pytest|spark|two-mounts|no-run)\b(?P<rest>.*?)-->\s*$")

SPARK_PRELUDE = """\
import os as _os
import sys as _sys
import tempfile as _tempfile

_os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
_os.environ["PYSPARK_PYTHON"] = _sys.executable
_os.environ["PYSPARK_DRIVER_PYTHON"] = _sys.executable
_scratch = _tempfile.mkdtemp(prefix="spark-", dir=_os.getcwd())

from pyspark.sql import SparkSession as _SparkSession

spark = (
    _SparkSession.builder.master("local[2]")
    .appName("fsbus-docs-sample")
    .config("spark.ui.enabled", "false")
    .config("spark.sql.shuffle.partitions", "2")
    .config("spark.local.dir", _scratch)
    .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={_scratch}")
    .config("spark.executor.extraJavaOptions", f"-Djava.io.tmpdir={_scratch}")
    .config("spark.sql.warehouse.dir", _os.path.join(_scratch, "warehouse"))
    .getOrCreate()
)
"""


@dataclass(frozen=True)
class Sample:
    """One fenced python block of a markdown page."""

    path: Path
    """The markdown file."""
    line: int
    """Line of the opening fence (1-based)."""
    code: str
    """The block's source, dedented to the fence."""
    kind: str
    """"python", "pytest", "spark", "two-mounts" or "no-run"."""
    reason: str
    """Why a no-run block is not run; the mount points of a two-mounts block."""

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def extract(path: Path) -> list[Sample]:
    """The python blocks of one markdown file, with the marker that precedes each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    samples: list[Sample] = []
    i = 0
    previous = ""  # last non-blank line before the current one
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            if lines[i].strip():
                previous = lines[i]
            i += 1
            continue
        fence, indent, info = m["fence"], len(m["indent"]), m["info"].lower()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            line = lines[i]
            body.append(line[indent:] if not line[:indent].strip() else line.lstrip())
            i += 1
        i += 1  # the closing fence
        if info in ("python", "py"):
            marker = _MARKER.match(previous)
            kind = marker["kind"] if marker else "python"
            reason = marker["rest"].strip(" :") if marker else ""
            samples.append(Sample(path, start + 1, "\n".join(body) + "\n", kind, reason))
        previous = ""
    return samples


def pages() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [p for p in found if p.exists()]


def all_samples() -> list[Sample]:
    return [s for page in pages() for s in extract(page)]


def _param(sample: Sample) -> object:
    if sample.kind == "spark":
        marks = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(SPARK_TIMEOUT + 60)]
    else:
        marks = [pytest.mark.timeout(TIMEOUT + 30)]
    return pytest.param(sample, id=sample.id, marks=marks)


SAMPLES = all_samples()


def test_samples_are_found() -> None:
    assert any(s.path.name == "getting-started.md" for s in SAMPLES)


@pytest.mark.parametrize("sample", [_param(s) for s in SAMPLES])
def test_sample_runs(sample: Sample, tmp_path: Path) -> None:
    if sample.kind == "no-run":
        assert sample.reason, f"{sample.id}: say why in <!-- no-run: reason -->"
        pytest.skip(f"not run: {sample.reason}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "FSBUS_"))}
    timeout = TIMEOUT
    if sample.kind == "pytest":
        script = tmp_path / "test_sample.py"
        script.write_text(sample.code, encoding="utf-8")
        # its own temporary directory, or it cleans up old runs under the system's
        base = f"--basetemp={tmp_path / 'basetemp'}"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", base, script.name]
    else:
        code = sample.code
        if sample.kind == "spark":
            if shutil.which("java") is None:
                pytest.skip("Spark samples need Java 17 on PATH")
            code = SPARK_PRELUDE + "\n" + code
            timeout = SPARK_TIMEOUT
        script = tmp_path / "sample.py"
        script.write_text(code, encoding="utf-8")
        cmd = [sys.executable, script.name]
        if sample.kind == "two-mounts":
            cmd = _in_two_mounts(sample, tmp_path, cmd)
    try:
        proc = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"{sample.id}: did not finish within {timeout} s\n--- output ---\n"
            f"{_text(exc.stdout)}{_text(exc.stderr)}"
        )
    if proc.returncode != 0:
        pytest.fail(
            f"{sample.id}: exited with {proc.returncode}\n--- code ---\n{sample.code}"
            f"--- stdout ---\n{proc.stdout}--- stderr ---\n{proc.stderr}",
            pytrace=False,
        )


def _in_two_mounts(sample: Sample, tmp_path: Path, cmd: list[str]) -> list[str]:
    """Run ``cmd`` where the sample's two mount points show one fresh directory."""
    points = sample.reason.split()
    usage = f"{sample.id}: write <!-- two-mounts: /path/a /path/b -->"
    assert len(points) == 2, usage
    assert all(p.startswith("/") for p in points), usage
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("two-mounts samples need root and unshare (util-linux)")
    shared = tmp_path / "shared"
    shared.mkdir()
    parents = sorted({os.path.dirname(p) for p in points})
    script = "set -e\n"
    for parent in parents:  # a private tmpfs, so no mount point is made on the host
        script += f"mount -t tmpfs fsbus-sample {parent}\n"
    for point in points:
        script += f"mkdir -p {point}\nmount --bind {shared} {point}\n"
    script += 'exec "$@"\n'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *cmd]


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode("utf-8", "replace")


# --- the extractor itself ---------------------------------------------------------------


def test_extract_reads_markers_and_skips_other_languages(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# t\n\n```python\nprint(1)\n```\n\n<!-- spark -->\n```python\nspark.range(1)\n```\n"
        "\n```text\nnot python\n```\n\n<!-- no-run: needs a NAS -->\n\n```py\nx = 1\n```\n"
        "- item\n\n    ```python\n    indented = True\n    ```\n"
        "<!-- pytest -->\n````python\ndef test_x():\n    '''```'''\n````\n",
        encoding="utf-8",
    )
    got = [(s.line, s.kind, s.reason, s.code) for s in extract(page)]
    assert got == [
        (3, "python", "", "print(1)\n"),
        (8, "spark", "", "spark.range(1)\n"),
        (18, "no-run", "needs a NAS", "x = 1\n"),
        (23, "python", "", "indented = True\n"),
        (27, "pytest", "", "def test_x():\n    '''```'''\n"),
    ]
