"""A sweep: points (backend x shape x parameters) measured into one run folder, and the commands that
read runs back.  :mod:`.config` says which points (each measured by :mod:`mlabench.bench`);
:mod:`.run` and :mod:`.runner` measure them in :mod:`.order`, over :mod:`.visits`, watched by the
:mod:`.sentinel`; :mod:`.check` is the correctness-only sweep; :mod:`.compare` and :mod:`.diff` read
recorded runs."""
