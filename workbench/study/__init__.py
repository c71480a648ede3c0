"""The personalization study: prompts per method, training, evaluation, baselines, and the stages that run them
(`stages/`, in order by `pipeline.py`); the other layers read a study through `outputs.py` alone."""
