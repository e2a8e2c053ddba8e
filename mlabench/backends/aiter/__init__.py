"""AITER (ROCm) as backends: ``aiter-asm`` (:mod:`.asm_backend`) and ``aiter-gluon``
(:mod:`.gluon_backend`) on the base both share (:mod:`.common`); the API manifest written from AITER's source
(:mod:`.manifest`, ``manifest.toml``), the probe of the installed AITER against it (:mod:`.probe`),
AITER's launch rules by version (:mod:`.rules`) and its argument layouts (:mod:`.args`)."""
