"""Measuring one point, below the sweep and the tuner that measure many: :mod:`.point` says what a
point is and which fields its record carries; :mod:`.shape_bench` holds one shape's inputs and
references and checks and times a backend on them into a record."""
