"""Every bench script's latest output, kept in RESULTS.md: the one place measured figures live.

A script runs its main() inside `recorded(__file__)`: what it prints still goes to the terminal, and when it
finishes without an error the block of RESULTS.md between `<!-- bench/NAME.py -->` and `<!-- /bench/NAME.py -->` is
replaced by that output, with the command line, the date and the machine it ran on. A failed or interrupted run
changes nothing. `--no-record` on the command line leaves RESULTS.md alone (a trial run), and so does a script's
own `--child` process (it prints JSON for its parent, which records the table).
"""

from __future__ import annotations

import contextlib
import io
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "RESULTS.md"


class _Tee(io.TextIOBase):
    """Writes to the terminal and keeps a copy."""

    def __init__(self, terminal: io.TextIOBase) -> None:
        self.terminal, self.copy = terminal, io.StringIO()

    def write(self, text: str) -> int:
        self.terminal.write(text)
        return self.copy.write(text)

    def flush(self) -> None:
        self.terminal.flush()


def machine() -> str:
    """The cores, the CPU's name and the GPUs, so a figure is never read as another machine's."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), cpu)
    gpus = ""
    if shutil.which("nvidia-smi"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
            gpus = ", ".join(subprocess.run(query, capture_output=True, text=True, timeout=10).stdout.split("\n")[:-1])
    return f"{os.cpu_count()} cores ({cpu}){', ' + gpus if gpus else ''}, Python {platform.python_version()}"


def block(script: str, command: str, output: str) -> str:
    when = time.strftime("%Y-%m-%d")
    return (f"<!-- {script} -->\n`{command}` ({when}, {machine()}):\n\n```\n{output.rstrip()}\n```\n"
            f"<!-- /{script} -->")  # fmt: skip


def write_block(script: str, text: str, results: Path | None = None) -> None:
    """Replace the script's block in RESULTS.md (or append one); written to a temp file, then renamed."""
    results = results or RESULTS
    current = results.read_text(encoding="utf-8") if results.is_file() else "# Results\n"
    pattern = re.compile(rf"<!-- {re.escape(script)} -->.*?<!-- /{re.escape(script)} -->", re.S)
    updated = pattern.sub(lambda _: text, current) if pattern.search(current) else current.rstrip() + "\n\n" + text
    tmp = results.with_name(f".{results.name}.tmp-{os.getpid()}")
    tmp.write_text(updated.rstrip() + "\n", encoding="utf-8")
    os.replace(tmp, results)


@contextlib.contextmanager
def recorded(script_file: str) -> Iterator[None]:
    """Run the block with its output kept; on success, it becomes the script's block of RESULTS.md."""
    trial = "--no-record" in sys.argv
    if trial:
        sys.argv.remove("--no-record")  # the script's own parser does not know it
    record = not trial and "--child" not in sys.argv
    script = f"bench/{Path(script_file).name}"
    command = shlex.join(["python", script, *sys.argv[1:]])
    tee = _Tee(sys.stdout)  # type: ignore[arg-type]
    with contextlib.redirect_stdout(tee):
        yield
    if record:
        write_block(script, block(script, command, tee.copy.getvalue()))
        print(f"(recorded in {RESULTS})")
