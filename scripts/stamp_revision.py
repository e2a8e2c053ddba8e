"""Stamp the checkout's git revision for a copy of the tree that travels without its ``.git``.

Run here before a call on the GPU machine, and name the stamp in the call's ``carry``:

    python3 scripts/stamp_revision.py [REPO [REVISION]]   # writes REPO/.mlabench-revision.json
        # (git-ignored; REPO defaults to this checkout) and prints it; REVISION: REPO is that
        # commit's mlabench/ exported with git archive (scripts/h200_bisect.sh prepare)
    run(command=..., carry=[..., ".mlabench-revision.json"])

Runs there then record this revision, dirty as stamped while their code is what was stamped, and
dirty once it differs (:func:`mlabench.records.provenance.git_revision`).
"""

import json
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(CHECKOUT))
from mlabench.records.provenance import write_revision_stamp  # noqa: E402

if __name__ == "__main__":
    try:
        print(json.dumps(write_revision_stamp(Path(sys.argv[1]) if len(sys.argv) > 1 else CHECKOUT,
                                              sys.argv[2] if len(sys.argv) > 2 else None)))
    except RuntimeError as exc:
        sys.exit(f"error: {exc}")
