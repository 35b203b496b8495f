"""The toy task (column-wise addition with a verifiable reward) and the 64-symbol character tokenizer it is
written in. Imports nothing else of rlwb."""
