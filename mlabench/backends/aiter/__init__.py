"""AITER (ROCm) as backends: ``aiter-asm`` (:mod:`.asm_backend`, with the base both share) and
``aiter-gluon`` (:mod:`.gluon_backend`); the API manifest written from AITER's source
(:mod:`.manifest`, ``manifest.toml``), the probe of the installed AITER against it (:mod:`.probe`),
AITER's launch rules by version (:mod:`.rules`) and its argument layouts (:mod:`.args`)."""
