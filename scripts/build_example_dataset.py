"""Writes the procedurally drawn example dataset: ``python scripts/build_example_dataset.py --output DIR``."""

from diffsynth.core.data.example_dataset import main

if __name__ == "__main__":
    raise SystemExit(main())
