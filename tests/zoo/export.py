#!/usr/bin/env python3
"""Exports the corpus's [[exported]] models: public architectures written by the exporters
their users run (torch.onnx, then ONNX Runtime's transformer optimizer), for the families no
wheel ships as ONNX (BERT-style encoders with dynamic dims, decoders with a KV cache and
tied embeddings).

Usage: export.py RECIPE OUT.onnx [WEIGHTS_DIR]

Runs in the environment tests/zoo/fetch.py makes for it (pinned torch, transformers,
onnxruntime: see EXPORT_REQUIREMENTS there), never at test time. Recipes:
  bert     a BertModel from WEIGHTS_DIR (config.json, model.safetensors), exported by
           torch.onnx (TorchScript) with batch and sequence dynamic
  bert-ort the same, then through onnxruntime.transformers.optimizer (model_type bert):
           Attention, SkipLayerNormalization, EmbedLayerNormalization, BiasGelu
  gpt2     one decoder step of GPT-2 small (the architecture's own config, weights drawn
           from seed 0: no wheel ships GPT-2's): input_ids, attention_mask and the past keys
           and values of every layer in, logits and the present keys and values out; the
           output projection is the token-embedding table (tied), as GPT-2 ties them
"""
import os
import sys
import tempfile

import torch


def export_bert(weights, out):
    from safetensors.torch import load_file
    from transformers import BertConfig, BertModel

    cfg = BertConfig.from_json_file(os.path.join(weights, "config.json"))
    cfg._attn_implementation = "eager"
    model = BertModel(cfg, add_pooling_layer=True)
    state = load_file(os.path.join(weights, "model.safetensors"))
    state = {k.removeprefix("bert."): v for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    # position_ids is a buffer some checkpoints carry and others do not.
    missing = [k for k in missing if not k.endswith("position_ids")]
    unexpected = [k for k in unexpected if not k.endswith("position_ids")]
    if missing or unexpected:
        sys.exit(f"bert: weights do not match the config: missing {missing}, unexpected {unexpected}")
    model.eval()
    ids = torch.ones(2, 16, dtype=torch.int64)
    dims = {0: "batch", 1: "sequence"}
    torch.onnx.export(
        model,
        (ids, torch.ones_like(ids), torch.zeros_like(ids)),
        out,
        input_names=["input_ids", "attention_mask", "token_type_ids"],
        output_names=["last_hidden_state", "pooler_output"],
        dynamic_axes={"input_ids": dims, "attention_mask": dims, "token_type_ids": dims,
                      "last_hidden_state": dims, "pooler_output": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )
    return cfg


def export_bert_ort(weights, out):
    from onnxruntime.transformers import optimizer

    with tempfile.TemporaryDirectory() as d:
        plain = os.path.join(d, "bert.onnx")
        cfg = export_bert(weights, plain)
        opt = optimizer.optimize_model(plain, model_type="bert", num_heads=cfg.num_attention_heads,
                                       hidden_size=cfg.hidden_size, opt_level=1)
        fused = opt.get_fused_operator_statistics()
        if not fused.get("Attention") or not fused.get("SkipLayerNormalization"):
            sys.exit(f"bert-ort: the optimizer fused too little: {fused}")
        opt.save_model_to_file(out)


def export_gpt2(out):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config()
    cfg._attn_implementation = "eager"
    model = GPT2LMHeadModel(cfg)
    model.eval()
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(), "gpt2: weights not tied"
    layers, heads, head = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head

    class Step(torch.nn.Module):
        """One decoding step over a cache passed as plain tensors (past_key_0, past_value_0, ...)."""

        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, *past):
            cache = tuple((past[2 * i], past[2 * i + 1]) for i in range(layers))
            o = self.m(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
            return (o.logits, *[t for kv in o.past_key_values for t in kv])

    batch, past_len = 1, 8
    ids = torch.ones(batch, 1, dtype=torch.int64)
    mask = torch.ones(batch, past_len + 1, dtype=torch.int64)
    past = [torch.zeros(batch, heads, past_len, head) for _ in range(2 * layers)]
    past_names = [f"past_{kv}_{i}" for i in range(layers) for kv in ("key", "value")]
    present_names = [f"present_{kv}_{i}" for i in range(layers) for kv in ("key", "value")]
    dynamic = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "total"},
               "logits": {0: "batch", 1: "sequence"}}
    dynamic.update({n: {0: "batch", 2: "past"} for n in past_names})
    dynamic.update({n: {0: "batch", 2: "total"} for n in present_names})
    torch.onnx.export(
        Step(model),
        (ids, mask, *past),
        out,
        input_names=["input_ids", "attention_mask", *past_names],
        output_names=["logits", *present_names],
        dynamic_axes=dynamic,
        opset_version=17,
        dynamo=False,
    )


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    recipe, out = sys.argv[1], sys.argv[2]
    weights = sys.argv[3] if len(sys.argv) > 3 else None
    if recipe in ("bert", "bert-ort") and not weights:
        sys.exit(f"{recipe}: needs WEIGHTS_DIR")
    if recipe == "bert":
        export_bert(weights, out)
    elif recipe == "bert-ort":
        export_bert_ort(weights, out)
    elif recipe == "gpt2":
        export_gpt2(out)
    else:
        sys.exit(f"unknown recipe {recipe!r}")


if __name__ == "__main__":
    main()
