"""Entry point kept for `python -m training.trainer` (documented, used on bare GPU nodes and under
torchrun): the trainer itself is training.train.trainer."""

from training.train.trainer import main

if __name__ == "__main__":
    raise SystemExit(main())
