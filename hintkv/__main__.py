"""`python -m hintkv` is the same as the `hintkv` console script."""

from hintkv.cli import main

raise SystemExit(main())
