"""What runs leave behind and how it is read back: the record and manifest (:mod:`.record`), the
run folder's store (:mod:`.store`), its CSV (:mod:`.csv_rows`) and a run's provenance
(:mod:`.provenance`)."""
