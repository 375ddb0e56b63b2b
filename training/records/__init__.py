"""Generation records (curator generate's output) and the training rows they yield: token ids and loss masks."""
