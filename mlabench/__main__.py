"""``python -m mlabench``: the same as the ``mlabench`` console script."""

from mlabench.cli.app import main

main()
