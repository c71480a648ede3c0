"""Qwen3 and Llama for TensorRT-LLM's PyTorch backend, taking the user vector as a multimodal input.

The soft-token method replaces the embedding of the `<|user|>` placeholder with
`projector(user_vector)`. TensorRT-LLM has no per-request "replace this embedding" input, but it
does carry per-request multimodal data to the model's forward, and (>= 1.3.0rc0) accepts
externally computed embeddings as multimodal inputs (`inputs["multi_modal_embeddings"]`, handled by
`BaseMultimodalInputProcessor.attach_multimodal_embeddings`, `tensorrt_llm/inputs/registry.py`).
So the user vector travels as a one-row "user" embedding, and this module:

1. registers an input processor (`register_input_processor`) whose `attach_multimodal_embeddings`
   keeps the token ids as given and passes the raw vector through as multimodal data;
2. subclasses the built-in `Qwen3ForCausalLM` / `LlamaForCausalLM` (`@register_auto_model` under the
   same architecture names, so an out-of-tree registration claims the slot, as the model-zoo note in
   `tensorrt_llm/_torch/models/__init__.py` describes) and, in `forward`, embeds the tokens, projects
   the vector with the checkpoint's projector (`projector.safetensors`, found through
   `checkpoint_files.py`: the serving view TensorRT-LLM loads leaves it out) and writes it at the
   placeholder positions before the decoder runs.

Pattern and APIs from TensorRT-LLM 1.3.0rc20: `examples/llm-api/out_of_tree_example/modeling_opt.py`
(`DecoderModelForCausalLM`, `register_auto_model`), `tensorrt_llm/inputs/registry.py`
(`register_input_processor`, `MultimodalPlaceholderMetadata`), `tensorrt_llm/_torch/models/
modeling_qwen3.py` / `modeling_llama.py` (the base classes). Written, not run here: a GPU host runs
it through scripts/validate_gpu_engines.sh.
"""

from __future__ import annotations

import os

import torch
from tensorrt_llm._torch.models.modeling_llama import LlamaForCausalLM
from tensorrt_llm._torch.models.modeling_qwen3 import Qwen3ForCausalLM
from tensorrt_llm._torch.models.modeling_utils import register_auto_model
from tensorrt_llm.inputs.registry import (
    BaseMultimodalInputProcessor,
    MultimodalPlaceholderMetadata,
    MultimodalPlaceholderPlacement,
    register_input_processor,
)

from .checkpoint_files import CHECKPOINT_ENV, projector_file, workbench_meta

USER_MODALITY = "user"  # the multimodal key the workbench sends the user vector under


class SoftTokenInputProcessor(BaseMultimodalInputProcessor):
    """Token ids pass through unchanged; the user vector rides along as multimodal data."""

    def __init__(self, model_path, config, tokenizer, trust_remote_code: bool = True, **kwargs):
        super().__init__(model_path, config, tokenizer, trust_remote_code, **kwargs)
        self._dtype = getattr(config, "torch_dtype", torch.float32)

    @property
    def processor(self):
        return None

    @property
    def tokenizer(self):
        return self._tokenizer

    @property
    def config(self):
        return self._config

    @property
    def dtype(self):
        return self._dtype

    def __call__(self, inputs, sampling_params):
        ids = inputs.get("prompt_token_ids")
        if ids is None:
            ids = self._tokenizer.encode(inputs["prompt"], add_special_tokens=False)
        return list(ids), None

    def attach_multimodal_embeddings(self, inputs, multimodal_embedding, sampling_params):
        ids, _ = self(inputs, sampling_params)
        vecs = multimodal_embedding.get(USER_MODALITY)
        if not vecs:
            raise ValueError(f"soft-token request without a '{USER_MODALITY}' embedding")
        vec = torch.as_tensor(vecs[0], dtype=torch.float32).reshape(1, -1)  # [1, user_vector_dim]
        return ids, {"multimodal_data": {USER_MODALITY: {"user_vector": vec}}}


class _SoftTokenMixin:
    """Projector + placeholder replacement shared by the Qwen3 and Llama variants."""

    def _init_soft_token(self, model_config) -> None:
        cfg = model_config.pretrained_config
        # `_name_or_path` is the serving view (launcher.serving_dir), which leaves the projector out:
        # checkpoint_files resolves the checkpoint behind it (config.json's symlink target, else the
        # launcher's WORKBENCH_TRTLLM_CHECKPOINT) for workbench.json and projector.safetensors alike.
        model_dir = getattr(cfg, "_name_or_path", "") or os.environ.get(CHECKPOINT_ENV, "")
        meta = workbench_meta(model_dir)
        layout = meta["layout"]
        n_levels = len(layout["item_codebooks"])
        # same id arithmetic as workbench.sids.layout.SidLayout.placeholder_id (first special token)
        self.placeholder_id = int(layout["base_vocab_size"]) + sum(layout["item_codebooks"]) + int(
            layout["dedup_size"]) + sum(layout.get("user_codebooks", []))
        assert n_levels >= 1
        self.projector = None
        proj_cfg = meta.get("projector")
        if proj_cfg:
            from safetensors.torch import load_file

            state = load_file(str(projector_file(model_dir)))
            hidden = int(proj_cfg["hidden_size"])
            if proj_cfg.get("kind", "linear") == "linear":
                net = torch.nn.Linear(int(proj_cfg["in_dim"]), hidden)
            else:
                net = torch.nn.Sequential(torch.nn.Linear(int(proj_cfg["in_dim"]), hidden), torch.nn.GELU(),
                                          torch.nn.Linear(hidden, hidden))
            net.load_state_dict({k.removeprefix("net."): v for k, v in state.items()})
            self.projector = net.eval()

    def _soft_token_embeds(self, input_ids: torch.Tensor, multimodal_params) -> torch.Tensor | None:
        """[num_tokens, hidden] input embeddings with each request's placeholder replaced, or None."""
        vecs = []
        for p in multimodal_params or []:
            data = getattr(p, "multimodal_data", None) or {}
            if USER_MODALITY in data:
                vecs.append(data[USER_MODALITY]["user_vector"])
        if not vecs:
            return None
        if self.projector is None:
            raise ValueError("this checkpoint has no soft-token projector")
        embed = self.model.embed_tokens(input_ids)  # [num_tokens, hidden]; requests are packed
        pos = torch.nonzero(input_ids == self.placeholder_id).flatten()
        if len(pos) != len(vecs):
            raise ValueError(f"{len(pos)} <|user|> placeholders in the batch but {len(vecs)} user vectors")
        proj = self.projector.to(embed.device)
        rows = proj(torch.cat(vecs).to(embed.device, torch.float32)).to(embed.dtype)  # [n_requests, hidden]
        embed = embed.clone()
        embed[pos] = rows
        return embed

    def forward(self, attn_metadata, input_ids=None, position_ids=None, inputs_embeds=None,
                return_context_logits: bool = False, **kwargs):
        mm = kwargs.pop("multimodal_params", None)
        if inputs_embeds is None and input_ids is not None:
            embeds = self._soft_token_embeds(input_ids, mm)
            if embeds is not None:
                inputs_embeds, input_ids = embeds, None
        return super().forward(attn_metadata, input_ids=input_ids, position_ids=position_ids,
                               inputs_embeds=inputs_embeds, return_context_logits=return_context_logits, **kwargs)


_PLACEHOLDER = MultimodalPlaceholderMetadata(placeholder_map={USER_MODALITY: "<|user|>"},
                                             placeholder_placement=MultimodalPlaceholderPlacement.BEFORE_TEXT)


@register_auto_model("Qwen3ForCausalLM")
@register_input_processor(SoftTokenInputProcessor, model_type="qwen3", placeholder_metadata=_PLACEHOLDER)
class SoftTokenQwen3ForCausalLM(_SoftTokenMixin, Qwen3ForCausalLM):
    def __init__(self, model_config):
        super().__init__(model_config)
        self._init_soft_token(model_config)


@register_auto_model("LlamaForCausalLM")
@register_input_processor(SoftTokenInputProcessor, model_type="llama", placeholder_metadata=_PLACEHOLDER)
class SoftTokenLlamaForCausalLM(_SoftTokenMixin, LlamaForCausalLM):
    def __init__(self, model_config):
        super().__init__(model_config)
        self._init_soft_token(model_config)
