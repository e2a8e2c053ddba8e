"""``mlabench report`` and ``mlabench plot``: one document (:mod:`.build`: markdown or HTML, its
sections in :mod:`.sections` and :mod:`.tuning_sections`, its blocks in :mod:`.document`) and the
figures (:mod:`.figures`) from recorded runs, loaded by :mod:`.runs`.  Nothing here measures."""
