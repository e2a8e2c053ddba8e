"""scripts/rocm_validate.sh, with ``python3 -m mlabench`` stood in for by a stub that records each
command and says both AITER backends are available: what it runs and where it puts the results."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
BACKENDS_JSON = ('[{"rows": [{"backend": "aiter-asm", "available": true}, '
                 '{"backend": "aiter-gluon", "available": true}, '
                 '{"backend": "triton-splitkv", "available": false}]}]')


def test_graph_check_of_both_aiter_backends_lands_in_the_folder_sent_back(tmp_path):
    bin_dir, log, out = tmp_path / "bin", tmp_path / "mlabench.log", tmp_path / "validate"
    bin_dir.mkdir()
    stub = bin_dir / "python3"
    stub.write_text(f"""#!/usr/bin/env bash
if [ "$1" = "-m" ] && [ "$2" = "mlabench" ]; then
    shift 2
    echo "$*" >> {log}
    if [ "$1" = backends ] && [[ " $* " == *" --json "* ]]; then echo '{BACKENDS_JSON}'; fi
    exit 0
fi
exec {sys.executable} "$@"
""")
    stub.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    run = subprocess.run(["bash", str(REPO / "scripts/rocm_validate.sh"), str(out)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    commands = log.read_text().splitlines()
    graph_check = [c for c in commands if c.startswith("graph-check")]
    assert graph_check == [f"graph-check --backend aiter-asm --backend aiter-gluon --batch 1,8 --context "
                           f"4096,16384,32768,65536,100000,131072 --save {out}/graph-check-aiter.json --markdown"]
    assert "graph-check-aiter 0" in (out / "steps.txt").read_text().splitlines()
    assert (out / "graph-check-aiter.md").exists()
    listed = subprocess.run(["tar", "tzf", f"{out}.tar.gz"], capture_output=True, text=True, check=True)
    assert "validate/graph-check-aiter.md" in listed.stdout.split()
