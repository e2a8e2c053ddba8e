"""Figures from recorded runs (``mlabench plot``, and the figures of ``mlabench report``): which can be
drawn from the runs (:mod:`.plan`, returning :mod:`.spec`'s types), their data (:mod:`.data`,
:mod:`.tuning_data`, :mod:`.graph_check_data`), and matplotlib drawing (:mod:`.draw`,
:mod:`.draw_tuning`, :mod:`.draw_serving`, :mod:`.style`)."""
