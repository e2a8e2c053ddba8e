"""The instruments of one measurement: timing (:mod:`.timing`), sample statistics (:mod:`.stats`),
memory bandwidth (:mod:`.bandwidth`), the GPU's clocks and power (:mod:`.observers`) and the warm-up
to a steady clock (:mod:`.steady`).  Nothing here knows backends, records or runs."""
