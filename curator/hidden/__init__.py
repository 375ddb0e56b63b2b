"""The hidden-state stage: the target's aux-layer (and final) states of the regenerated data.

`capture.py` is `curator hidden-states` as one library call (check, plan the disk, capture into a
store with transformers here or through an engine's capture operation, curator/engines/);
`engine_feed.py` draws the states from vLLM servers as engine-fed training needs them, instead of
a store; `feed_plan_view.py` prices those feeds for `curator plan`. The model side of the stage
(the hooked forward, the store, the disk plan) is training/capture/ and training/storage/.
"""
