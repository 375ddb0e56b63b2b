"""Entry point kept for `python -m training.hidden_states` (documented, used on bare GPU nodes and
under torchrun): the capture itself is training.capture.hidden_states."""

from training.capture.hidden_states import main

if __name__ == "__main__":
    raise SystemExit(main())
