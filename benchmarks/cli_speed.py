"""The jaxmove command end to end against parse + passes, text and --json (issue 29).

    python benchmarks/cli_speed.py [N ...]     (default 100000 instructions)

For each size, a synthetic module (benchmarks/synth_hlo.py) is written to a temporary file and
timed in fresh processes: ``jaxmove.analyze(path)`` (parse + every pass, timed inside the
process, imports excluded), ``jaxmove analyze PATH`` and ``jaxmove analyze PATH --json`` (wall
time of the whole process, imports included, output to /dev/null). Prints a Markdown table of
wall seconds and peak RSS (``/usr/bin/time``'s maximum resident set size), and one of CPU
seconds (user + system: on a shared machine, less sensitive to the other load than wall time;
``time.process_time`` in the process for parse + passes, ``/usr/bin/time`` for the CLI).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
_INNER = ("import sys, time; import jaxmove; t = time.perf_counter(); c = time.process_time(); "
          "jaxmove.analyze(sys.argv[1]); print(time.perf_counter() - t, time.process_time() - c)")


def _run(cmd: list[str], env: dict) -> tuple[float, float, float, str]:
    """(wall s, CPU s (user + system), peak RSS MiB, stdout) of one process."""
    t = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%U %S %M", *cmd], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, check=True, env=env)
    wall = time.perf_counter() - t
    user, system, rss_kib = p.stderr.strip().splitlines()[-1].split()
    return wall, float(user) + float(system), int(rss_kib) / 1024, p.stdout


def main(sizes: list[int]) -> None:
    sys.path.insert(0, str(HERE))
    from synth_hlo import generate

    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    walls, cpus = [], []
    for n in sizes:
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / f"synth_{n}.hlo"
            path.write_text(generate(n))
            imp, imp_cpu, _, _ = _run([sys.executable, "-c", "import jaxmove"], env)
            _, _, inner_rss, out = _run([sys.executable, "-c", _INNER, str(path)], env)
            inner, inner_cpu = map(float, out.strip().splitlines()[-1].split())
            cli = [sys.executable, "-m", "jaxmove.cli", "analyze", str(path)]
            text_s, text_cpu, text_rss, _ = _run(cli, env)
            json_s, json_cpu, json_rss, _ = _run([*cli, "--json"], env)
        walls.append(f"| {n:,} | {imp:.2f} | {inner:.2f} | {text_s:.2f} | {text_s / inner:.2f} | {json_s:.2f} | "
                     f"{json_s / inner:.2f} | {inner_rss:.0f} MiB | {text_rss:.0f} MiB | {json_rss:.0f} MiB |")
        cpus.append(f"| {n:,} | {imp_cpu:.2f} | {inner_cpu:.2f} | {text_cpu:.2f} | {text_cpu / inner_cpu:.2f} | "
                    f"{json_cpu:.2f} | {json_cpu / inner_cpu:.2f} |")
    print("Wall seconds, peak RSS:\n")
    print("| instructions | import s | parse + passes s | CLI text s | text / (parse+passes) | CLI --json s "
          "| json / (parse+passes) | parse + passes RSS | text RSS | json RSS |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(walls))
    print("\nCPU seconds (user + system):\n")
    print("| instructions | import | parse + passes | CLI text | text / (parse+passes) | CLI --json "
          "| json / (parse+passes) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(cpus))


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [100_000])
