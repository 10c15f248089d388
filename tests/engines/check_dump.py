#!/usr/bin/env python
"""Fails check-engine's `dump` check only: its dump answers with a path in a subdirectory (which
the localiser crashed on: issue 26, item 5), holding the logits of other positions (its
positions shifted by one)."""
import os

from conformant_engine import Conformant, read_safetensors, write_safetensors


class Engine(Conformant):
    def dump(self, req):
        if req.get("mode") == "decode":  # the decode path is right: only the `dump` check fails
            return super().dump(req)
        every = self.points(req["prompt_token_ids"], read_safetensors(req["graft"]) if req.get("graft") else None)
        names = [n for n in (req.get("points") or every) if n in every]
        sub = os.path.join(req["directory"], "sub")
        os.makedirs(sub)
        path = os.path.join(sub, "activations.safetensors")
        shifted = {n: [max(0, p - 1) if n == "logits" else p for p in req["positions"]] for n in names}
        write_safetensors(path, {n: [every[n][p] for p in shifted[n]] for n in names})
        return {"id": req["id"], "path": path, "points": names}


Engine().run()
