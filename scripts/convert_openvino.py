#!/usr/bin/env python
"""Convert a Llama checkpoint to OpenVINO IR (f32 and int8 weights) under build/openvino/.

Runs under the OpenVINO environment (.venvs/openvino, made by scripts/install-openvino.sh),
without optimum-intel: the transformers torch model is wrapped so its KV cache is explicit
tensors, traced by OpenVINO's own `ov.convert_model`, then made stateful the way OpenVINO
GenAI's LLMPipeline expects (inputs input_ids, attention_mask, position_ids, beam_idx; output
logits; the KV cache in ReadValue/Assign states, reordered by beam_idx). The tokenizer is
converted with openvino-tokenizers. int8 is nncf's `compress_weights` (INT8_ASYM, per channel)
on the f32 IR.

Traps handled:
  * `ov.save_model` compresses weights to f16 by DEFAULT (compress_to_fp16=True): an "f32" IR
    saved that way is f16 weights. Saved here with compress_to_fp16=False and checked.
  * The tracing example must have a non-empty past (length 2 here): a trace with an empty past
    specialises away the cache concatenation.

A conversion is redone only when the checkpoint or a tool version changed (a stamp file says
what it was made from), and is written to a temporary directory renamed into place.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "strict_gate" / "models" / "tiny-llama"
OUT = ROOT / "build" / "openvino"
WEIGHTS = ("f32", "int8")
COPY = ("config.json", "generation_config.json")
STAMP = "strict-gate-conversion.json"


def source_digest(model: Path) -> dict[str, str]:
    """sha256 of every file of the checkpoint: what the conversion depends on."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(model.iterdir()) if p.is_file()}


def versions() -> dict[str, str]:
    import nncf
    import openvino
    import openvino_tokenizers
    import torch
    import transformers

    return {"openvino": openvino.__version__, "openvino_tokenizers": openvino_tokenizers.__version__,
            "nncf": nncf.__version__, "torch": torch.__version__, "transformers": transformers.__version__}


def wrapped(model_dir: Path):
    """The HF model with its KV cache as explicit inputs/outputs (2 per layer)."""
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    layers = hf.config.num_hidden_layers

    class Explicit(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.hf = hf

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache(config=hf.config)
            for i, layer in enumerate(cache.layers):  # set, not update(): its lazy start cats onto a 1-d empty
                layer.keys, layer.values = past[2 * i], past[2 * i + 1]
                layer.dtype, layer.device, layer.is_initialized = past[0].dtype, past[0].device, True
            out = self.hf(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          past_key_values=cache, use_cache=True)
            kv = out.past_key_values
            return (out.logits, *[t for i in range(layers) for t in (kv.layers[i].keys, kv.layers[i].values)])

    return Explicit(), hf.config


def to_ir(model_dir: Path):
    """ov.convert_model of the explicit-cache model, then made stateful for GenAI."""
    import openvino as ov
    import torch

    module, cfg = wrapped(model_dir)
    kvh, hd = cfg.num_key_value_heads, getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    n = cfg.num_hidden_layers
    past = [torch.zeros(1, kvh, 2, hd) for _ in range(2 * n)]
    example = (torch.tensor([[1, 2, 3]]), torch.ones(1, 5, dtype=torch.int64), torch.tensor([[2, 3, 4]]), *past)
    shapes = [ov.PartialShape([-1, -1])] * 3 + [ov.PartialShape([-1, kvh, -1, hd])] * (2 * n)
    with torch.no_grad():
        m = ov.convert_model(module, example_input=example, input=shapes)
    names = ["input_ids", "attention_mask", "position_ids"] + [f"past_key_values.{i}.{w}" for i in range(n)
                                                                for w in ("key", "value")]
    for port, name in zip(m.inputs, names):
        port.get_tensor().set_names({name})
    outs = ["logits"] + [f"present.{i}.{w}" for i in range(n) for w in ("key", "value")]
    for port, name in zip(m.outputs, outs):
        port.get_tensor().set_names({name})
    make_stateful(m, names[3:], outs[1:])
    return m


def make_stateful(m, past: list[str], present: list[str]) -> None:
    """beam_idx reorders the cache (a Gather on each past input), then past/present become
    states whose initial value is an empty [batch, heads, 0, head_dim] tensor."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops
    from openvino._offline_transformations import apply_make_stateful_transformation

    beam = ops.parameter(ov.PartialShape([-1]), ov.Type.i32, name="beam_idx")
    beam.output(0).get_tensor().set_names({"beam_idx"})
    m.add_parameters([beam])
    for name in past:
        port = m.input(name)
        consumers = port.get_target_inputs()
        gather = ops.gather(port, beam, ops.constant(0))
        for consumer in consumers:
            consumer.replace_source_output(gather.output(0))
    m.validate_nodes_and_infer_types()
    apply_make_stateful_transformation(m, dict(zip(past, present)))
    batch = ops.gather(ops.shape_of(m.input("input_ids"), output_type="i64"), ops.constant([0]), ops.constant(0))
    for op in m.get_ops():
        if op.get_type_name() == "ReadValue":
            dims = [d.get_min_length() for d in op.get_output_partial_shape(0)]
            parts = [batch] + [ops.constant(np.array([d], dtype=np.int64)) for d in dims[1:]]
            op.set_arguments([ops.broadcast(ops.constant(0.0, dtype=np.float32), ops.concat(parts, axis=0))])
    m.validate_nodes_and_infer_types()


def tokenizer(model_dir: Path, dest: Path) -> None:
    import openvino as ov
    from openvino_tokenizers import convert_tokenizer
    from transformers import AutoTokenizer

    tok, detok = convert_tokenizer(AutoTokenizer.from_pretrained(model_dir), with_detokenizer=True)
    ov.save_model(tok, dest / "openvino_tokenizer.xml")
    ov.save_model(detok, dest / "openvino_detokenizer.xml")


def convert(model: Path, out: Path, weights: tuple[str, ...]) -> None:
    import openvino as ov

    stamp = {"source": str(model), "files": source_digest(model), **versions()}
    todo = [w for w in weights if not ((d := out / f"{model.name}-{w}") / STAMP).is_file()
            or json.loads((d / STAMP).read_text()) != {**stamp, "weights": w}]
    if not todo:
        print(f"{out}/{model.name}-{{{','.join(weights)}}}: up to date", file=sys.stderr)
        return
    f32 = to_ir(model)
    for w in todo:
        dest = out / f"{model.name}-{w}"
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        ir = f32
        if w == "int8":
            import nncf

            ir = nncf.compress_weights(f32.clone(), mode=nncf.CompressWeightsMode.INT8_ASYM)
        ov.save_model(ir, tmp / "openvino_model.xml", compress_to_fp16=False)
        check_weights(tmp / "openvino_model.xml", w)
        tokenizer(model, tmp)
        for f in COPY:
            if (model / f).is_file():
                shutil.copy(model / f, tmp / f)
        (tmp / STAMP).write_text(json.dumps({**stamp, "weights": w}, indent=2) + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
        print(f"{dest}: converted ({w} weights)", file=sys.stderr)


def check_weights(xml: Path, w: str) -> None:
    """The IR's weight constants are what was asked: f32 has no f16 or int8 constant; int8 has
    int8 ones (nncf stores their per-channel scales as f16)."""
    import openvino as ov

    types = {op.get_output_element_type(0).get_type_name() for op in ov.Core().read_model(xml).get_ops()
             if op.get_type_name() == "Constant"}
    int8 = "u8" in types or "i8" in types
    if (w == "f32" and ("f16" in types or int8)) or (w == "int8" and not int8):
        raise SystemExit(f"{xml}: weight constants of types {sorted(types)}, not {w}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=MODEL, help="a transformers checkpoint directory")
    ap.add_argument("--out", type=Path, default=OUT, help="where the IR goes (default build/openvino)")
    ap.add_argument("--weights", nargs="+", choices=WEIGHTS, default=list(WEIGHTS))
    args = ap.parse_args(argv)
    if not (args.model / "config.json").is_file():
        ap.error(f"{args.model}: no config.json (give a transformers checkpoint directory)")
    args.out.mkdir(parents=True, exist_ok=True)
    convert(args.model.resolve(), args.out.resolve(), tuple(args.weights))
    return 0


if __name__ == "__main__":
    sys.exit(main())
