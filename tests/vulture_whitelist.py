"""Names in mlabench/ that nothing in this repository calls, kept on purpose (vulture reads this file
as a user of each; tests/core/test_structure.py runs it).  One line each, with why."""

from mlabench.policy.tuned import json_schema

json_schema  # public: docs/tuning.md tells users to call it for the policy file's JSON schema
