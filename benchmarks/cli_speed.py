"""The jaxmove command end to end against parse + passes, text and --json (issue 29).

    python benchmarks/cli_speed.py [N ...]     (default 100000 instructions)

For each size, a synthetic module (benchmarks/synth_hlo.py) is written to a temporary file and
timed in fresh processes: ``jaxmove.analyze(path)`` (parse + every pass, timed inside the
process, imports excluded), ``jaxmove analyze PATH`` and ``jaxmove analyze PATH --json`` (wall
time of the whole process, imports included, output to /dev/null). Prints a Markdown table.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
_INNER = ("import sys, time; import jaxmove; t = time.perf_counter(); jaxmove.analyze(sys.argv[1]); "
          "print(time.perf_counter() - t)")


def _wall(cmd: list[str]) -> tuple[float, float]:
    """(wall s, peak RSS MiB) of one process."""
    t = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True, check=True)
    return time.perf_counter() - t, int(p.stderr.strip().splitlines()[-1]) / 1024


def main(sizes: list[int]) -> None:
    sys.path.insert(0, str(HERE))
    from synth_hlo import generate

    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    print("| instructions | import s | parse + passes s | CLI text s | text / (parse+passes) | CLI --json s "
          "| json / (parse+passes) | text RSS | json RSS |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / f"synth_{n}.hlo"
            path.write_text(generate(n))
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import jaxmove"], env=env, check=True)
            imp = time.perf_counter() - t0
            inner = float(subprocess.run([sys.executable, "-c", _INNER, str(path)], env=env, check=True,
                                         capture_output=True, text=True).stdout.strip().splitlines()[-1])
            text_s, text_rss = _wall([sys.executable, "-m", "jaxmove.cli", "analyze", str(path)])
            json_s, json_rss = _wall([sys.executable, "-m", "jaxmove.cli", "analyze", str(path), "--json"])
            print(f"| {n:,} | {imp:.2f} | {inner:.2f} | {text_s:.2f} | {text_s / inner:.2f} | {json_s:.2f} | "
                  f"{json_s / inner:.2f} | {text_rss:.0f} MiB | {json_rss:.0f} MiB |", flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [100_000])
