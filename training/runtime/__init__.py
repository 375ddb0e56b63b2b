"""What every part of a run uses: which torchrun rank this process is, and the named phases a profile sorts time by."""
