"""The study's stages, one module each, in the order they run (`ORDER`); `pipeline.py` runs them.

A stage is a function of the `StageContext` (`context.py`): it reads what the stages it depends on (`DEPENDS`) put
on the context, computes its own products or loads them from the cache (`workbench.cache.cached`, keyed by a hash
of the config it reads and the keys of the stages before it), puts them on the context and logs its stats, figures
and config to the context's run. Stages never import each other: what several of them use is in `inputs.py`.

    data          data.stage_data                  MovieLens tables (filtered, dense ids) + leave-one-out split
    embeddings    embeddings.stage_embeddings      item text embeddings (when the quantizer reads them) + ALS
    semantic_ids  semantic_ids.stage_semantic_ids  item quantizer(s) + dedup digit, user quantizer, Catalog
    train         train.train_stage                one model per (method, seed, LR), the LR picked on validation
    evaluate      evaluate.evaluate_stage          the picked models and the baselines on the test users, compared
"""

from workbench import names

ORDER = names.STAGES
DEPENDS = {
    "data": (),
    "embeddings": ("data",),
    "semantic_ids": ("embeddings",),
    "train": ("semantic_ids",),
    "evaluate": ("train",),  # evaluates the models `train` picked (cache hits when nothing changed)
}
