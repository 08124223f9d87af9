#!/usr/bin/env python3
"""Reference fixtures from transformers' own SigLIP vision tower.

Run by hand (CI never needs Python):

    pip install torch transformers onnx onnxscript pillow safetensors
    python3 scripts/siglip_fixtures.py                      # fixtures/siglip-tiny
    python3 scripts/siglip_fixtures.py --so400m-one-layer /tmp/so400m-1

The default writes, under fixtures/siglip-tiny/ (committed, a few hundred KB):

  vision/            SiglipVisionModel.save_pretrained: config.json, model.safetensors
  full/              the same vision weights inside a whole SiglipModel (random small
                     text tower), saved sharded: model.safetensors.index.json and
                     shards, `vision_model.` prefix, `vision_config` in config.json
  model.onnx         torch.onnx.export (TorchScript exporter), opset 17, batch axis
                     dynamic, initializers inline
  model-ext/         torch.onnx.export (dynamo exporter), opset 18, batch fixed at 2,
                     initializers in an external data file
  images/a.png       two small synthetic images, neither the model's size
  images/b.jpg
  expected.safetensors  f32: `pixel_values` [2, C, H, W] (SiglipImageProcessor's),
                     `tokens` [2, T, W] (last_hidden_state) and `pooled` [2, W]
                     (pooler_output), transformers' eager f32 forward on the images
                     in that order.

`--so400m-one-layer DIR` writes the same kinds of files for a So400m-shaped model
(384 px, patch 14, width 1152, MLP 4304, 16 heads) with one encoder layer and one
image: about 200 MB, for a by-hand comparison, never committed.

The weights are random but not transformers' initialisation: every parameter is
drawn so that LayerNorm gains sit near 1 and each linear keeps its input's scale,
which makes every operation's output matter to the result.
"""

import argparse
import json
import os
import shutil

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import (
    SiglipConfig,
    SiglipImageProcessor,
    SiglipModel,
    SiglipVisionConfig,
    SiglipVisionModel,
)

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    image_size=32,
    patch_size=8,
    num_channels=3,
    layer_norm_eps=1e-6,
    hidden_act="gelu_pytorch_tanh",
)

SO400M_ONE_LAYER = dict(
    hidden_size=1152,
    intermediate_size=4304,
    num_hidden_layers=1,
    num_attention_heads=16,
    image_size=384,
    patch_size=14,
    num_channels=3,
    layer_norm_eps=1e-6,
    hidden_act="gelu_pytorch_tanh",
)


def randomise(model, seed):
    """Draws every parameter with a scale that keeps activations O(1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            n = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * n)
            elif name.endswith("bias") or "norm" in name:
                p.copy_(0.05 * n)
            elif "position_embedding" in name or name.endswith("probe"):
                p.copy_(0.5 * n)
            elif p.dim() >= 2:
                fan_in = p[0].numel()
                p.copy_(n / fan_in**0.5)
            else:
                p.copy_(0.05 * n)


def images(count, seed):
    """Synthetic photographs: smooth gradients with a few discs, odd sizes."""
    rng = np.random.default_rng(seed)
    sizes = [(50, 41), (37, 61), (45, 45)]
    out = []
    for i in range(count):
        w, h = sizes[i % len(sizes)]
        y, x = np.mgrid[0:h, 0:w].astype(np.float32)
        img = np.stack(
            [
                128 + 100 * np.sin(x / (5 + i) + rng.uniform(0, 6)),
                128 + 100 * np.cos(y / (7 + i) + rng.uniform(0, 6)),
                255 * (x + y) / (w + h),
            ],
            axis=-1,
        )
        for _ in range(3):
            cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(3, 12)
            mask = (x - cx) ** 2 + (y - cy) ** 2 < r * r
            img[mask] = rng.uniform(0, 255, size=3)
        out.append(Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--so400m-one-layer", metavar="DIR", default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    big = args.so400m_one_layer is not None
    out = args.so400m_one_layer if big else (args.out or "fixtures/siglip-tiny")
    dims = SO400M_ONE_LAYER if big else TINY
    count = 1 if big else 2

    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(os.path.join(out, "images"))

    torch.manual_seed(args.seed)
    vcfg = SiglipVisionConfig(**dims, attn_implementation="eager")
    model = SiglipVisionModel(vcfg).eval()
    randomise(model, args.seed)
    model.save_pretrained(os.path.join(out, "vision"), safe_serialization=True)

    names = []
    for i, img in enumerate(images(count, args.seed + 1)):
        name = ["a.png", "b.jpg", "c.png"][i]
        path = os.path.join(out, "images", name)
        if name.endswith(".jpg"):
            img.save(path, quality=95)
        else:
            img.save(path)
        names.append(path)
    # Read back from disk, as a user's image is: JPEG is lossy.
    loaded = [Image.open(p).convert("RGB") for p in names]
    processor = SiglipImageProcessor(
        size={"height": dims["image_size"], "width": dims["image_size"]}
    )
    pixel_values = processor(images=loaded, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        res = model(pixel_values=pixel_values)
    save_file(
        {
            "pixel_values": pixel_values.contiguous(),
            "tokens": res.last_hidden_state.contiguous(),
            "pooled": res.pooler_output.contiguous(),
        },
        os.path.join(out, "expected.safetensors"),
    )

    if not big:
        # The same vision tower inside a whole SiglipModel, sharded.
        tcfg = dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            vocab_size=64,
            max_position_embeddings=16,
        )
        full = SiglipModel(
            SiglipConfig(text_config=tcfg, vision_config=vcfg.to_dict())
        ).eval()
        full.vision_model.load_state_dict(model.state_dict())
        full.save_pretrained(
            os.path.join(out, "full"), safe_serialization=True, max_shard_size="40KB"
        )

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, pixel_values):
            r = self.m(pixel_values=pixel_values)
            return r.last_hidden_state, r.pooler_output

    wrapped = Wrap(model).eval()
    torch.onnx.export(
        wrapped,
        (pixel_values,),
        os.path.join(out, "model.onnx"),
        opset_version=17,
        dynamo=False,
        input_names=["pixel_values"],
        output_names=["last_hidden_state", "pooler_output"],
        dynamic_axes={
            "pixel_values": {0: "batch"},
            "last_hidden_state": {0: "batch"},
            "pooler_output": {0: "batch"},
        },
    )
    if not big:
        import onnx

        ext = os.path.join(out, "model-ext")
        os.makedirs(ext)
        tmp = os.path.join(ext, "tmp.onnx")
        torch.onnx.export(
            wrapped,
            (pixel_values,),
            tmp,
            opset_version=18,
            dynamo=True,
            input_names=["pixel_values"],
            output_names=["last_hidden_state", "pooler_output"],
        )
        m = onnx.load(tmp)
        for f in os.listdir(ext):
            os.remove(os.path.join(ext, f))
        onnx.save_model(
            m,
            os.path.join(ext, "model.onnx"),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location="model.onnx.data",
            size_threshold=0,
        )

    summary = {
        "dims": dims,
        "images": [os.path.basename(p) for p in names],
        "pooled_norm": [float(v) for v in res.pooler_output.norm(dim=-1)],
    }
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
        f.write("\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
