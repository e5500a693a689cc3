"""The blank that both lab model variants program: a LlamaForCausalLM state dict (float32) whose
embeddings carry a constant unit, a filler unit and one class unit per token the program reads,
and whose layers are zero (identity through the residual) until a variant sets them.

Only the lab venv (torch) calls this, from inside the build functions.
"""

from __future__ import annotations

from typing import Any

D_CONST = 0  # 1 for every token
D_FILLER = 1  # class unit of every token the program does not read


def blank_llama(vocab: int, hidden: int, attn_dim: int, intermediate: int, layers: int,
                classes: dict[int, int], noise_from: int, gen: Any) -> dict[str, Any]:
    """Embeddings with class units (`classes`: token id -> dim) and a whisper of seeded noise in the
    dims from `noise_from`; every layer's projections zero, its norms one."""
    import torch

    f32 = torch.float32
    emb = torch.zeros(vocab, hidden, dtype=f32)
    emb[:, D_CONST] = 1.0
    emb[:, D_FILLER] = 1.0
    for tid, dim in classes.items():
        emb[tid, D_FILLER] = 0.0
        emb[tid, dim] = 1.0
    emb[:, noise_from:] = 0.01 * torch.randn(vocab, hidden - noise_from, generator=gen)
    sd: dict[str, Any] = {"model.embed_tokens.weight": emb}
    for layer in range(layers):
        p = f"model.layers.{layer}."
        sd[p + "input_layernorm.weight"] = torch.ones(hidden, dtype=f32)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(hidden, dtype=f32)
        for name in ("q_proj", "k_proj", "v_proj"):
            sd[p + f"self_attn.{name}.weight"] = torch.zeros(attn_dim, hidden, dtype=f32)
        sd[p + "self_attn.o_proj.weight"] = torch.zeros(hidden, attn_dim, dtype=f32)
        sd[p + "mlp.gate_proj.weight"] = torch.zeros(intermediate, hidden, dtype=f32)
        sd[p + "mlp.up_proj.weight"] = torch.zeros(intermediate, hidden, dtype=f32)
        sd[p + "mlp.down_proj.weight"] = torch.zeros(hidden, intermediate, dtype=f32)
    sd["model.norm.weight"] = torch.ones(hidden, dtype=f32)
    return sd
