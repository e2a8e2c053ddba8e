"""Stamp the checkout's git revision for a copy of the tree that travels without its ``.git``.

Run here before a call on the GPU machine, and name the stamp in the call's ``carry``:

    python3 scripts/stamp_revision.py      # writes .mlabench-revision.json (git-ignored), prints it
    run(command=..., carry=[..., ".mlabench-revision.json"])

Runs there then record this revision (and whether it was dirty) while their code is what was
stamped (:func:`mlabench.records.provenance.git_revision`); once the code differs, the stamp is
ignored.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mlabench.records.provenance import write_revision_stamp  # noqa: E402

if __name__ == "__main__":
    print(json.dumps(write_revision_stamp()))
