"""The embedded models rlwb builds itself: one recipe module per model (`llama` the default policy, `chat`,
`moe`, `random_init`, `sampling_defaults_variant`; `bpe` the chat model's tokenizer) and `store`, which builds,
caches, locks and publishes every one of them (`published/`: the builds of record shipped with rlwb)."""
