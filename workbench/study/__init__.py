"""The personalization study: prompts per method, training, evaluation, baselines, and the stages that run them."""
