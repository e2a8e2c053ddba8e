"""The tuner: per (batch size, context bucket) an Optuna study of a backend's parameters.  The search
space and configuration (:mod:`.space`), the public heuristics and whole-tile rules measured first
(:mod:`.seeded_trials`), the studies (:mod:`.studies`), worker processes (:mod:`.worker_pool`) running
trials (:mod:`.trial_worker`), the choice per bucket (:mod:`.choice`), a run from start to policy
files (:mod:`.run`) and its manifest (:mod:`.manifest`), and the held-out validation of a policy: its
arithmetic and tables (:mod:`.validation`, no processes), its measurements (:mod:`.validation_run`)
and its scoring on measurements already recorded (:mod:`.rescore`, ``--from-run``)."""
