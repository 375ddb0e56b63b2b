"""The EAGLE-3 draft kind: the model, its weights, its TTT attention and objective, its vocabulary, its export layouts."""
