"""Tables: the one table type every command prints (:mod:`.table`) and its renderers (:mod:`.render`)."""
